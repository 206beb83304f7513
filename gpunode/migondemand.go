package gpunode

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/logging"
)

// WithMIGOnDemand lets the plugin make and destroy MIG devices through
// NVML (GPUs.MIG). owned reports the MIG devices the plugin made (by parent
// UUID and placement): the layout watch leaves them out of the published
// set, so making or destroying one rewrites the CDI spec without ending the
// round.
func WithMIGOnDemand(owned func(parent string, at gpu.MIGPlacement) bool) Option {
	return func(n *Node) { n.migOwned = owned }
}

// MIGOnDemand makes and destroys MIG devices on the node's GPUs through
// NVML, keeping the node's CDI spec listing every MIG device that exists,
// so a made one has its CDI device (the parent's node, its GI's and CI's
// access nodes) as a pre-made one does.
type MIGOnDemand struct {
	n  *Node
	b  *backend.Backend
	mu sync.Mutex
}

// Slots are the placements of every profile of GPU d (MIG mode on).
func (m *MIGOnDemand) Slots(d gpu.Device) ([]gpu.MIGSlot, error) { return m.b.MIGSlots(d) }

// Create makes the MIG device at slot on d and writes the CDI spec with
// it; on failure nothing it made is left.
func (m *MIGOnDemand) Create(ctx context.Context, d gpu.Device, slot gpu.MIGSlot) (gpu.MIGDevice, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	md, err := m.b.CreateMIG(d, slot)
	if err != nil {
		return md, err
	}
	if err := m.respec(ctx); err != nil {
		return gpu.MIGDevice{}, errors.Join(fmt.Errorf("MIG device %s made, but the CDI spec cannot name it: %w", md.UUID, err), m.b.DestroyMIG(d, slot))
	}
	return md, nil
}

// Destroy removes the MIG device at slot on d and writes the CDI spec
// without it. A spec that cannot be written keeps naming the gone device,
// which no container can get: it is logged, not returned.
func (m *MIGOnDemand) Destroy(ctx context.Context, d gpu.Device, slot gpu.MIGSlot) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.b.DestroyMIG(d, slot); err != nil {
		return err
	}
	if err := m.respec(ctx); err != nil {
		m.n.log.Warn("the CDI spec still names a destroyed MIG device", "parent_uuid", d.UUID, "profile", slot.Profile, "placement_start", slot.Placement.Start, logging.Err(err))
	}
	return nil
}

// respec writes the node's CDI spec for the GPUs as NVML lists them now.
func (m *MIGOnDemand) respec(ctx context.Context) error {
	node, err := m.b.Discover(ctx)
	if err != nil {
		return fmt.Errorf("discover GPUs: %w", err)
	}
	p, err := m.n.plan(node)
	if err != nil {
		return err
	}
	if _, _, err := spec.Write(m.n.cfg.CDISpecDir, p.spec); err != nil {
		return fmt.Errorf("write the CDI spec: %w; check that --cdi-spec-dir is writable", err)
	}
	return nil
}
