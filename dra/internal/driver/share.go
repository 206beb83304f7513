package driver

import (
	"errors"
	"fmt"
	"slices"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/claimconfig"
	"github.com/nvinject/nvinject/dra/internal/claimspec"
)

// sharedOf is what claim c shares: the UUIDs of its devices whose
// requests' GpuConfig shares them, and by which strategy ("" for none).
func sharedOf(c checkpoint.Claim) ([]string, claimconfig.Strategy, error) {
	var uuids []string
	var strategies []claimconfig.Strategy
	for _, dev := range c.Devices {
		if dev.Sharing == "" {
			continue
		}
		uuids = append(uuids, dev.UUID)
		if s := claimconfig.Strategy(dev.Sharing); !slices.Contains(strategies, s) {
			strategies = append(strategies, s)
		}
	}
	switch len(strategies) {
	case 0:
		return nil, "", nil
	case 1:
		return uuids, strategies[0], nil
	}
	return nil, "", fmt.Errorf("its requests share GPUs by different strategies (%s and %s); give the requests one sharing strategy", strategies[0], strategies[1])
}

// share writes the per-claim CDI spec of a claim that shares devices and
// adds the claim's own device to each shared device's CDI names, so every
// container given one gets it too.
func (d *Driver) share(cp *checkpoint.Claim) error {
	uuids, s, err := sharedOf(*cp)
	if err != nil || s == "" {
		return err
	}
	if d.claimSpecs == nil {
		return errors.New("its GpuConfig shares GPUs, and this nvinject-dra writes no per-claim CDI specs; remove the claim's sharing config")
	}
	edits, err := claimspec.Edits(cp.UID, s)
	if err != nil {
		return err
	}
	if err := d.claimSpecs.Write(cp.UID, uuids, edits); err != nil {
		return err
	}
	name := d.claimSpecs.Device(cp.UID)
	for i := range cp.Devices {
		if cp.Devices[i].Sharing != "" {
			cp.Devices[i].CDIDeviceIDs = append(slices.Clone(cp.Devices[i].CDIDeviceIDs), name)
		}
	}
	return nil
}

// restoreClaimSpecs makes the per-claim specs match the checkpoint after a
// restart: a claim unprepared while nvinject-dra was down leaves its spec,
// which goes; each shared claim still prepared gets its spec written again.
func (d *Driver) restoreClaimSpecs() error {
	if d.claimSpecs == nil {
		return nil
	}
	removed, err := d.claimSpecs.Prune(func(uid string) bool {
		c, ok := d.state.Get(uid)
		if !ok {
			return false
		}
		_, s, err := sharedOf(c)
		return err == nil && s != ""
	})
	if err != nil {
		return err
	}
	if len(removed) > 0 {
		d.log.Info("removed the CDI specs of shared claims no longer prepared", "claim_uids", removed)
	}
	for _, c := range d.state.All() {
		uuids, s, err := sharedOf(c)
		if err != nil || s == "" {
			continue
		}
		edits, err := claimspec.Edits(c.UID, s)
		if err != nil {
			return fmt.Errorf("restore the CDI spec of shared ResourceClaim %s: %w", c, err)
		}
		if err := d.claimSpecs.Write(c.UID, uuids, edits); err != nil {
			return fmt.Errorf("restore the CDI spec of shared ResourceClaim %s: %w", c, err)
		}
	}
	return nil
}
