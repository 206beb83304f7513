package driver

import (
	"context"
	"errors"
	"fmt"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// MIGMaker makes and destroys MIG devices through NVML (gpunode's
// MIGOnDemand); a made device is in the node's CDI spec when Create
// returns, and out of it once Destroy does.
type MIGMaker interface {
	// Slots are the placements of every profile of GPU d (MIG mode on).
	Slots(d gpu.Device) ([]gpu.MIGSlot, error)
	// Create makes a GPU instance and its compute instance at slot on d;
	// on failure nothing it made is left.
	Create(ctx context.Context, d gpu.Device, slot gpu.MIGSlot) (gpu.MIGDevice, error)
	// Destroy removes the instance at slot on d; a gone one is no error.
	Destroy(ctx context.Context, d gpu.Device, slot gpu.MIGSlot) error
}

// WithMIGOnDemand publishes each GPU with MIG mode on and no MIG device
// (but those made for claims) as its placements, one device per placement
// of each profile, consuming the memory slices it covers from the GPU's
// counter set; prepare makes the claim's MIG device through m and
// unprepare destroys it.
func WithMIGOnDemand(m MIGMaker) Option { return func(d *Driver) { d.maker = m } }

// onDemand reports whether g is published by its placements: MIG on and
// every MIG device it has made for a checkpointed claim.
func (d *Driver) onDemand(g gpu.Device, owned map[slotKey]bool) bool {
	if d.maker == nil || !g.MIGEnabled || g.MIGErr != nil {
		return false
	}
	for _, m := range g.MIG {
		if !owned[slotKey{g.UUID, m.Placement.Start, m.Placement.Size}] {
			return false
		}
	}
	return true
}

type slotKey struct {
	parent      string
	start, size int
}

// ownedSlots are the placements checkpointed claims made MIG devices at,
// pending ones included.
func ownedSlots(claims []checkpoint.Claim) map[slotKey]bool {
	out := map[slotKey]bool{}
	for _, c := range claims {
		for _, dev := range c.Devices {
			if m := dev.MIG; m != nil {
				out[slotKey{m.ParentUUID, m.Start, m.Size}] = true
			}
		}
	}
	return out
}

// OwnsMIG reports whether a claim in state made the MIG device of parent at
// placement at: the layout watch does not republish it as a free device.
func OwnsMIG(state *checkpoint.Store, parent string, at gpu.MIGPlacement) bool {
	return ownedSlots(state.All())[slotKey{parent, at.Start, at.Size}]
}

// slotDevices are g's placement devices.
func (d *Driver) slotDevices(g gpu.Device) ([]Device, error) {
	slots, err := d.maker.Slots(g)
	if err != nil {
		return nil, fmt.Errorf("list the MIG placements of GPU %d (%s) for --mig-on-demand: %w", g.Index, g.UUID, err)
	}
	out := make([]Device, 0, len(slots))
	for i := range slots {
		s := slots[i]
		out = append(out, Device{Device: g, Slot: &s, Name: contract.DRAMIGSlotDeviceName(g.Index, s.Profile, s.Placement.Start)})
	}
	return out, nil
}

func slotOf(s *checkpoint.MIGSlot) gpu.MIGSlot {
	return gpu.MIGSlot{Profile: s.Profile, GIProfile: s.GIProfile, Placement: gpu.MIGPlacement{Start: s.Start, Size: s.Size}}
}

// parentOf is the GPU a MIG device made on demand sits on: the published
// GPU, or its UUID and index from the checkpoint, which destroying needs.
func (d *Driver) parentOf(s *checkpoint.MIGSlot) gpu.Device {
	if g, ok := d.parents[s.ParentUUID]; ok {
		return g
	}
	return gpu.Device{UUID: s.ParentUUID, Index: s.ParentIndex}
}

// makeMIG records cp as pending, then makes the MIG device of each of its
// placement devices and names it in cp. On failure it destroys what it
// made and forgets cp.
func (d *Driver) makeMIG(ctx context.Context, cp *checkpoint.Claim) error {
	if !cp.Pending {
		return nil
	}
	if err := d.state.Put(*cp); err != nil {
		return err
	}
	for i := range cp.Devices {
		pd := &cp.Devices[i]
		if pd.MIG == nil {
			continue
		}
		m, err := d.maker.Create(ctx, d.parentOf(pd.MIG), slotOf(pd.MIG))
		if err != nil {
			return errors.Join(fmt.Errorf("make MIG device %s at slice %d of GPU %s: %w", pd.MIG.Profile, pd.MIG.Start, pd.MIG.ParentUUID, err), d.dropMIG(ctx, *cp))
		}
		pd.UUID, pd.CDIDeviceIDs = m.UUID, []string{d.cdiName(m.UUID)}
		d.log.InfoContext(ctx, "MIG device made for claim", "claim", cp.String(), "uuid", m.UUID, "profile", m.Profile, "parent_uuid", pd.MIG.ParentUUID, "placement_start", pd.MIG.Start, "gpu_instance", m.GPUInstance)
	}
	cp.Pending = false
	return nil
}

// dropMIG destroys the MIG devices claim c made, then forgets c.
func (d *Driver) dropMIG(ctx context.Context, c checkpoint.Claim) error {
	if err := d.destroyMIG(ctx, c); err != nil {
		return err
	}
	_, err := d.state.Delete(c.UID)
	return err
}

// destroyMIG destroys the MIG devices claim c made.
func (d *Driver) destroyMIG(ctx context.Context, c checkpoint.Claim) error {
	var errs []error
	for _, dev := range c.Devices {
		if dev.MIG == nil {
			continue
		}
		if d.maker == nil {
			errs = append(errs, fmt.Errorf("ResourceClaim %s holds a MIG device made on demand at slice %d of GPU %s; start nvinject-dra with --mig-on-demand to destroy it", c, dev.MIG.Start, dev.MIG.ParentUUID))
			continue
		}
		if err := d.maker.Destroy(ctx, d.parentOf(dev.MIG), slotOf(dev.MIG)); err != nil {
			errs = append(errs, fmt.Errorf("destroy the MIG device of ResourceClaim %s at slice %d of GPU %s: %w", c, dev.MIG.Start, dev.MIG.ParentUUID, err))
			continue
		}
		d.log.Info("MIG device made on demand destroyed", "claim", c.String(), "uuid", dev.UUID, "profile", dev.MIG.Profile, "parent_uuid", dev.MIG.ParentUUID, "placement_start", dev.MIG.Start)
	}
	return errors.Join(errs...)
}

// dropPending destroys what claims cut off mid-prepare made, and forgets
// them: kubelet never got an answer for them and prepares them again.
func (d *Driver) dropPending() error {
	var errs []error
	for _, c := range d.state.All() {
		if !c.Pending {
			continue
		}
		d.log.Warn("claim was cut off while its MIG devices were made; destroying them (kubelet prepares it again)", "claim", c.String(), "claim_uid", c.UID)
		errs = append(errs, d.dropMIG(context.Background(), c))
	}
	return errors.Join(errs...)
}
