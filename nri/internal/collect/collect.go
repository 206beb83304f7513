// Package collect finds the CDI device names a container asks for, from
// every place kubelet and nvinject's device plugin can put them.
package collect

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nvinject/nvinject/shared/annotations"
)

// CDIAnnotationPrefix is the key prefix containerd resolves CDI names from.
const CDIAnnotationPrefix = "cdi.k8s.io/"

// DefaultAnnotationPrefix is the name nvinject's device plugin puts in its
// cdi.k8s.io/<prefix>_<device-id> annotation keys.
const DefaultAnnotationPrefix = "nvinject.gpu"

// Collector reads CDI names from containers and pods.
type Collector struct {
	key string
}

// Option configures a Collector.
type Option func(*Collector)

// WithAnnotationPrefix sets the device plugin's name in its
// cdi.k8s.io/<prefix>_<device-id> annotation keys (default "nvinject.gpu");
// "" takes every cdi.k8s.io/ annotation.
func WithAnnotationPrefix(p string) Option {
	return func(c *Collector) {
		c.key = CDIAnnotationPrefix
		if p != "" {
			c.key += p + "_"
		}
	}
}

// New returns a Collector.
func New(opts ...Option) (*Collector, error) {
	c := &Collector{key: CDIAnnotationPrefix + DefaultAnnotationPrefix + "_"}
	for _, o := range opts {
		o(c)
	}
	if strings.Count(c.key, "/") != 1 {
		return nil, fmt.Errorf("--annotation-prefix must not contain '/': it is the device plugin's name in %s<prefix>_<device-id> keys", CDIAnnotationPrefix)
	}
	return c, nil
}

// Container returns the qualified CDI names the container requests, in
// order of first appearance: CRI CDIDevices, the device plugin's CDI
// annotations (sorted by key, so the order is stable), then nvinject's own
// annotation. Any malformed value is an error.
func (c *Collector) Container(ctr *api.Container) ([]string, error) {
	var names []string
	for _, d := range ctr.GetCDIDevices() {
		names = append(names, d.GetName())
	}
	fromAnn, err := c.annotations(ctr.GetAnnotations())
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", ctr.GetName(), err)
	}
	names = append(names, fromAnn...)
	for _, n := range names {
		if _, _, _, err := parser.ParseQualifiedName(n); err != nil {
			return nil, fmt.Errorf("container %s: CDI device %q: %w", ctr.GetName(), n, err)
		}
	}
	return dedup(names), nil
}

// Pod returns the CDI names found in pod-level annotations. Neither
// containerd nor kubelet's device manager puts CDI names there, so any
// name found is something a user wrote into the pod. Malformed values are
// returned as-is so they can still be reported as a spoofing attempt.
func (c *Collector) Pod(pod *api.PodSandbox) []string {
	var names []string
	for _, k := range sortedKeys(pod.GetAnnotations()) {
		v := pod.GetAnnotations()[k]
		if k == annotations.DevicesKey || strings.HasPrefix(k, CDIAnnotationPrefix) {
			for _, n := range strings.Split(v, ",") {
				if n = strings.TrimSpace(n); n != "" {
					names = append(names, n)
				}
			}
		}
	}
	return dedup(names)
}

func (c *Collector) annotations(ann map[string]string) ([]string, error) {
	var names []string
	for _, k := range sortedKeys(ann) {
		v := ann[k]
		switch {
		case k == annotations.DevicesKey:
			got, err := annotations.Parse(v)
			if err != nil {
				return nil, err
			}
			names = append(names, got...)
		case strings.HasPrefix(k, c.key):
			for _, n := range strings.Split(v, ",") {
				n = strings.TrimSpace(n)
				if n == "" {
					return nil, fmt.Errorf("annotation %s=%q has an empty CDI device name", k, v)
				}
				names = append(names, n)
			}
		}
	}
	return names, nil
}

// AnyCDI returns the names in every cdi.k8s.io/ container annotation,
// whatever its key: containerd injects all of them on its own, so they
// count when deciding whether a pod outside the served runtime handlers
// asks for GPUs. Entries are split leniently; they are only compared.
func (c *Collector) AnyCDI(ctr *api.Container) []string {
	var names []string
	for _, k := range sortedKeys(ctr.GetAnnotations()) {
		if strings.HasPrefix(k, CDIAnnotationPrefix) {
			for _, n := range strings.Split(ctr.GetAnnotations()[k], ",") {
				names = append(names, strings.TrimSpace(n))
			}
		}
	}
	return names
}

// Kind reports whether name is a qualified CDI name of vendor/class.
func Kind(name, vendor, class string) bool {
	v, c, _, err := parser.ParseQualifiedName(name)
	return err == nil && v == vendor && c == class
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func dedup(names []string) []string {
	seen := make(map[string]bool, len(names))
	out := names[:0:0]
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
