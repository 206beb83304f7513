// Package allocate turns the CDI names of a container's GPUs into kubelet's
// ContainerAllocateResponse, encoded by the shared contract so the NRI
// plugin decodes exactly what was written. It only formats: no NVML, no
// file I/O.
package allocate

import (
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/shared/contract"
)

// Responder builds responses.
type Responder struct {
	enc *contract.Encoder
}

// New returns a Responder writing prefix's annotations in strategies.
func New(prefix string, strategies ...contract.Strategy) (*Responder, error) {
	enc, err := contract.NewEncoder(prefix, strategies...)
	if err != nil {
		return nil, err
	}
	return &Responder{enc: enc}, nil
}

// Check verifies at start that every device ID can be encoded, so
// Allocate cannot fail on it later.
func (r *Responder) Check(ids []string) error { return r.enc.Check(ids) }

// Container answers for one container given its device IDs, in request
// order, and their qualified CDI names.
func (r *Responder) Container(ids, names []string) (*pluginapi.ContainerAllocateResponse, error) {
	a, err := r.enc.Encode(ids, names)
	if err != nil {
		return nil, err
	}
	resp := &pluginapi.ContainerAllocateResponse{Annotations: a.Annotations}
	for _, n := range a.CDIDevices {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
	}
	return resp, nil
}
