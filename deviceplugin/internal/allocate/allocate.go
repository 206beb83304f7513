// Package allocate turns the CDI names of a container's GPUs into kubelet's
// ContainerAllocateResponse in the configured strategies. It only formats:
// no NVML, no file I/O.
package allocate

import (
	"errors"
	"fmt"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/shared/annotations"
)

// Responder builds responses.
type Responder struct {
	annotations bool
	cri         bool
	nri         bool
	prefix      string
}

// Option configures a Responder.
type Option func(*Responder)

// WithCDIAnnotations sets cdi.k8s.io/<prefix>_<first device ID> to the names.
func WithCDIAnnotations(prefix string) Option {
	return func(r *Responder) { r.annotations, r.prefix = true, prefix }
}

// WithCRI fills the CRI CDIDevices field.
func WithCRI() Option { return func(r *Responder) { r.cri = true } }

// WithNRI sets nvinject's own annotation, which only nvinject's NRI plugin
// reads, so containerd's built-in CDI support leaves the devices alone.
func WithNRI() Option { return func(r *Responder) { r.nri = true } }

// New returns a Responder; at least one strategy is required.
func New(opts ...Option) (*Responder, error) {
	r := &Responder{}
	for _, o := range opts {
		o(r)
	}
	if !r.annotations && !r.cri && !r.nri {
		return nil, errors.New("no device list strategy configured; set DEVICE_LIST_STRATEGY to cdi-annotations, cdi-cri and/or nri")
	}
	return r, nil
}

// Check verifies at start that an annotation key can be made for every
// device ID, so Allocate cannot fail on it later.
func (r *Responder) Check(ids []string) error {
	if !r.annotations {
		return nil
	}
	for _, id := range ids {
		if _, err := cdi.AnnotationKey(r.prefix, id); err != nil {
			return fmt.Errorf("--cdi-annotation-prefix=%q cannot form a CDI annotation key for device %q (%w); use a shorter prefix of letters, digits, '.', '-' and '_'", r.prefix, id, err)
		}
	}
	return nil
}

// Container answers for one container given its device IDs, in request
// order, and their qualified CDI names.
func (r *Responder) Container(ids, names []string) (*pluginapi.ContainerAllocateResponse, error) {
	if len(ids) == 0 || len(ids) != len(names) {
		return nil, fmt.Errorf("allocate: %d device IDs for %d CDI names", len(ids), len(names))
	}
	resp := &pluginapi.ContainerAllocateResponse{}
	if r.annotations {
		a, err := cdi.UpdateAnnotations(nil, r.prefix, ids[0], names)
		if err != nil {
			return nil, fmt.Errorf("allocate %v: %w", ids, err)
		}
		resp.Annotations = a
	}
	if r.nri {
		if resp.Annotations == nil {
			resp.Annotations = map[string]string{}
		}
		resp.Annotations[annotations.DevicesKey] = annotations.Format(names)
	}
	if r.cri {
		for _, n := range names {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
		}
	}
	return resp, nil
}
