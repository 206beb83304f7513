//go:build !nosim

// Package scalesim is nvinject-dra's ResourceSlice publication for SIMULATED nodes,
// many from one process: each node's devices come from the simulated NVML
// (shared/gpu/sim) through the same discovery and the same slice building as
// nvinject-dra (dra/internal/driver), and are published by the DRA library's
// ResourceSlice controller with the Node as owner, as the kubelet plugin helper does.
// A node's reported health (what nvinject-dra's limiter delivered) is set from
// outside (SetReported) and becomes device taints through the driver's own slice
// code. The fleet-scale simulator (e2e/bench/cmd/scale-sim) runs thousands on a
// control plane with fake nodes; nvinject-dra itself does not use this package.
package scalesim

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/gpunode/nodelabels"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
)

// Node is one simulated node's GPUs as nvinject-dra would publish them.
type Node struct {
	name   string
	facts  gpu.Node
	drv    *driver.Driver
	health *reported
}

// NewNode discovers the GPUs of the simulated node nvml names ("sim:h100-80gb*8";
// host=name is added so every node has GPUs of its own) and builds nvinject-dra's
// driver for them. stateDir holds the driver's (empty) claim checkpoint.
func NewNode(ctx context.Context, name, nvml, stateDir string) (*Node, error) {
	b, _, err := backend.OpenSimulated(nvml+",host="+name, backend.Options{})
	if err != nil {
		return nil, fmt.Errorf("simulated node %s: %w", name, err)
	}
	facts, err := b.Discover(ctx)
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("simulated node %s: discover: %w", name, err)
	}
	// The driver reads no claim while it only publishes: an empty checkpoint is
	// all New needs, and closing it keeps one file descriptor per node away.
	state, err := checkpoint.Open(filepath.Join(stateDir, name))
	if err != nil {
		return nil, err
	}
	defer state.Close()
	cdiName := func(uuid string) string { return contract.CDIKind(contract.CDIVendor, "gpu") + "=" + uuid }
	h := &reported{}
	for _, d := range facts.Devices {
		h.states = append(h.states, health.State{UUID: d.UUID, Healthy: true})
	}
	drv, err := driver.New(name, facts, facts.Devices, cdiName, h, state)
	if err != nil {
		return nil, fmt.Errorf("simulated node %s: %w", name, err)
	}
	return &Node{name: name, facts: facts, drv: drv, health: h}, nil
}

// Name is the node's name (its ResourceSlice pool).
func (n *Node) Name() string { return n.name }

// GPUs is the number of devices the node publishes.
func (n *Node) GPUs() int { return len(n.drv.Devices()) }

// Labels are the GPU feature discovery labels nvinject's kubelet plugins put on the node.
func (n *Node) Labels() map[string]string {
	return nodelabels.Compute(nodelabels.Facts{Node: n.facts, Published: n.facts.Devices,
		MIG: gpuselect.MIGMixed, ResourceName: contract.ResourceName}).Labels
}

// Resources is the node's ResourceSlice content for its reported health,
// exactly nvinject-dra's: an Unhealthy GPU's device carries its taint.
func (n *Node) Resources() resourceslice.DriverResources { return n.drv.Resources() }

// Reported is every GPU's reported health in publication order (all Healthy
// until SetReported).
func (n *Node) Reported() []health.State { return n.health.States() }

// SetReported makes states the node's reported health, as nvinject-dra's
// health.Reported does with what its limiter delivers, and returns the
// ResourceSlice content to republish (resourceslice.Controller.Update).
func (n *Node) SetReported(states []health.State) resourceslice.DriverResources {
	n.health.set(states)
	return n.drv.Resources()
}

// Publish starts the ResourceSlice controller for the node (the Node object must
// exist: the controller owns the slices by its UID) and returns once it has synced;
// it publishes in the background until ctx ends or Stop. errs gets what the
// controller could not publish.
func (n *Node) Publish(ctx context.Context, client kubernetes.Interface, errs func(node string, err error)) (*resourceslice.Controller, error) {
	res := n.Resources()
	c, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: contract.DRADriver, KubeClient: client,
		Owner:     &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: n.name},
		Resources: &res,
		ErrorHandler: func(_ context.Context, err error, msg string) {
			errs(n.name, fmt.Errorf("%s: %w", msg, err))
		},
	})
	if err != nil {
		return nil, fmt.Errorf("publish the ResourceSlices of %s: %w", n.name, err)
	}
	return c, nil
}

// reported is the health the simulator reports for a node; the driver's
// slice code reads it as nvinject-dra reads health.Reported.
type reported struct {
	mu     sync.Mutex
	states []health.State
}

func (r *reported) States() []health.State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.states)
}

func (r *reported) set(states []health.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = slices.Clone(states)
}

// Subscribe never fires: the simulator republishes after SetReported itself.
func (r *reported) Subscribe() (<-chan struct{}, func()) { return make(chan struct{}), func() {} }
