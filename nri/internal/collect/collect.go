// Package collect finds the CDI device names a container asks for, from
// every place kubelet and nvinject's device plugin can put them. The
// encoding is the contract's: collect only adapts NRI's types to it.
package collect

import (
	"fmt"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/shared/contract"
)

// Collector reads CDI names from containers and pods.
type Collector struct {
	prefix string
	dec    *contract.Decoder
}

// Option configures a Collector.
type Option func(*Collector)

// WithAnnotationPrefix sets the device plugin's name in its
// cdi.k8s.io/<prefix>_<device-id> annotation keys (default
// contract.AnnotationPrefix); "" takes every cdi.k8s.io/ annotation.
func WithAnnotationPrefix(p string) Option { return func(c *Collector) { c.prefix = p } }

// New returns a Collector.
func New(opts ...Option) (*Collector, error) {
	c := &Collector{prefix: contract.AnnotationPrefix}
	for _, o := range opts {
		o(c)
	}
	dec, err := contract.NewDecoder(c.prefix)
	if err != nil {
		return nil, err
	}
	c.dec = dec
	return c, nil
}

// Container returns the qualified CDI names the container requests, in
// order of first appearance: CRI CDIDevices, the device plugin's CDI
// annotations (sorted by key), then contract.DevicesAnnotation. Any
// malformed value is an error, bounded in length.
func (c *Collector) Container(ctr *api.Container) ([]string, error) {
	a := contract.Allocation{Annotations: ctr.GetAnnotations()}
	for _, d := range ctr.GetCDIDevices() {
		a.CDIDevices = append(a.CDIDevices, d.GetName())
	}
	names, err := c.dec.Decode(a)
	if err != nil {
		return nil, contract.Bound(fmt.Errorf("container %s: %w", ctr.GetName(), err))
	}
	return names, nil
}

// Pod returns the CDI names found in pod-level annotations. Neither
// containerd nor kubelet's device manager puts CDI names there, so any
// name found is something a user wrote into the pod. Malformed values are
// returned as-is so they can still be reported as a spoofing attempt.
func (c *Collector) Pod(pod *api.PodSandbox) []string {
	var names []string
	for _, k := range contract.SortedKeys(pod.GetAnnotations()) {
		if k == contract.DevicesAnnotation || strings.HasPrefix(k, cdi.AnnotationPrefix) {
			names = append(names, split(pod.GetAnnotations()[k])...)
		}
	}
	return contract.Dedup(names)
}

// AnyCDI returns the names in every cdi.k8s.io/ container annotation,
// whatever its key: containerd injects all of them on its own, so they
// count when deciding whether a pod outside the served runtime handlers
// asks for GPUs. Entries are split leniently; they are only compared.
func (c *Collector) AnyCDI(ctr *api.Container) []string {
	var names []string
	for _, k := range contract.SortedKeys(ctr.GetAnnotations()) {
		if strings.HasPrefix(k, cdi.AnnotationPrefix) {
			names = append(names, split(ctr.GetAnnotations()[k])...)
		}
	}
	return names
}

func split(v string) []string {
	var out []string
	for _, n := range strings.Split(v, ",") {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}
