package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/gpunode/mps"
	"github.com/nvinject/nvinject/shared/contract"

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

// share writes the per-claim CDI spec of a claim that shares devices, or
// holds them with admin access, and adds the claim's own device to each
// such device's CDI names, so every container given one gets it too.
func (d *Driver) share(ctx context.Context, cp *checkpoint.Claim) error {
	_, s, err := sharedOf(*cp)
	if err != nil {
		return err
	}
	admin := adminOf(*cp)
	if s == "" && len(admin) == 0 {
		return nil
	}
	if s != "" && len(admin) > 0 {
		return errors.New("it asks for admin access and shares its GPUs by its GpuConfig; an admin-access claim only watches GPUs that other claims hold: remove its sharing config")
	}
	if d.claimSpecs == nil {
		return errors.New("its GpuConfig shares GPUs, or it asks for admin access, and this nvinject-dra writes no per-claim CDI specs; remove the claim's sharing config or admin access")
	}
	// The UID becomes host paths (the spec file, the MPS daemon's
	// directories, mounted into containers): checked before any is made.
	if err := claimspec.ValidUID(cp.UID); err != nil {
		return err
	}
	uuids, edits, err := d.claimSpecOf(*cp)
	if err != nil {
		return err
	}
	if s == claimconfig.MPS {
		// The claim's daemon runs before any container can be given it.
		if err := d.syncMPS(func(c checkpoint.Claim) bool { return c.UID != cp.UID }, cp); err != nil {
			return err
		}
		if err := d.waitShare(ctx, *cp); err != nil {
			return errors.Join(err, d.syncMPS(func(c checkpoint.Claim) bool { return c.UID != cp.UID }, nil))
		}
	}
	if err := d.claimSpecs.Write(cp.UID, uuids, edits, claimAnnotations(*cp)); err != nil {
		return err
	}
	name := d.claimSpecs.Device(cp.UID)
	for i := range cp.Devices {
		if cp.Devices[i].Sharing != "" || cp.Devices[i].AdminAccess {
			cp.Devices[i].CDIDeviceIDs = append(slices.Clone(cp.Devices[i].CDIDeviceIDs), name)
		}
	}
	return nil
}

// adminOf are the UUIDs claim c holds with admin access.
func adminOf(c checkpoint.Claim) []string {
	var out []string
	for _, dev := range c.Devices {
		if dev.AdminAccess {
			out = append(out, dev.UUID)
		}
	}
	return out
}

// claimSpecOf is what claim c's own CDI device names and gives: the GPUs
// it shares and their edits, or the GPUs it holds with admin access and
// the claim's UID in the environment. Empty for a claim with neither.
func (d *Driver) claimSpecOf(c checkpoint.Claim) ([]string, specs.ContainerEdits, error) {
	uuids, s, err := sharedOf(c)
	if err != nil {
		return nil, specs.ContainerEdits{}, err
	}
	if s != "" {
		edits, err := d.claimEdits(c, uuids, s)
		return uuids, edits, err
	}
	admin := adminOf(c)
	if len(admin) == 0 {
		return nil, specs.ContainerEdits{}, nil
	}
	return admin, specs.ContainerEdits{Env: []string{contract.EnvSharedClaim + "=" + c.UID}}, nil
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
		uuids, _, err := d.claimSpecOf(c)
		return err == nil && len(uuids) > 0
	})
	if err != nil {
		return err
	}
	if len(removed) > 0 {
		d.log.Info("removed the CDI specs of shared claims no longer prepared", "claim_uids", removed)
	}
	if err := d.syncMPS(func(checkpoint.Claim) bool { return true }, nil); err != nil {
		d.log.Error("the MPS daemons of prepared claims cannot run; their containers cannot start CUDA", "error", err)
	}
	for _, c := range d.state.All() {
		uuids, edits, err := d.claimSpecOf(c)
		if err != nil {
			return fmt.Errorf("restore the CDI spec of shared ResourceClaim %s: %w", c, err)
		}
		if len(uuids) == 0 {
			continue
		}
		if err := d.claimSpecs.Write(c.UID, uuids, edits, claimAnnotations(c)); err != nil {
			return fmt.Errorf("restore the CDI spec of shared ResourceClaim %s: %w", c, err)
		}
	}
	return nil
}

// mpsLimits are the MPS daemon limits a request's GpuConfig asks for: all
// the SMs and no memory limit unless it says otherwise.
func mpsLimits(c *claimconfig.GpuConfig) *checkpoint.MPSLimits {
	if c.Strategy() != claimconfig.MPS {
		return nil
	}
	l := &checkpoint.MPSLimits{ActiveThreadPercentage: 100}
	if m := c.Sharing.MpsConfig; m != nil {
		if m.DefaultActiveThreadPercentage != nil {
			l.ActiveThreadPercentage = *m.DefaultActiveThreadPercentage
		}
		if m.DefaultPinnedDeviceMemoryLimit != nil {
			l.PinnedMemoryMiB = uint64(m.DefaultPinnedDeviceMemoryLimit.Value()) >> 20
		}
	}
	return l
}

// daemonOf is claim c's MPS daemon, if c shares through MPS: one daemon per
// claim over the claim's shared devices, named by the claim's UID.
func daemonOf(c checkpoint.Claim) (mps.Daemon, bool) {
	var visible []string
	var l *checkpoint.MPSLimits
	for _, dev := range c.Devices {
		if dev.MPS != nil {
			visible, l = append(visible, dev.UUID), dev.MPS
		}
	}
	if l == nil {
		return mps.Daemon{}, false
	}
	return mps.Daemon{ID: c.UID, Visible: strings.Join(visible, ","), ActiveThreadPercentage: l.ActiveThreadPercentage, PinnedMemoryMiB: l.PinnedMemoryMiB}, true
}

// syncMPS runs the MPS daemons of the prepared claims keep selects, and of
// extra (a claim being prepared).
func (d *Driver) syncMPS(keep func(checkpoint.Claim) bool, extra *checkpoint.Claim) error {
	if d.mps == nil {
		return nil
	}
	var ds []mps.Daemon
	for _, c := range d.state.All() {
		if dm, ok := daemonOf(c); ok && keep(c) {
			ds = append(ds, dm)
		}
	}
	if extra != nil {
		if dm, ok := daemonOf(*extra); ok {
			ds = append(ds, dm)
		}
	}
	return d.mps.Sync(ds)
}

// claimEdits are what each container of claim c, sharing uuids by s, gets
// from the claim's own device: the claim's UID, and under MPS its daemon's
// pipe dir, the daemons' /dev/shm and the limits.
func (d *Driver) claimEdits(c checkpoint.Claim, uuids []string, s claimconfig.Strategy) (specs.ContainerEdits, error) {
	edits, err := claimspec.Edits(c.UID, s)
	if err != nil || s != claimconfig.MPS {
		return edits, err
	}
	dm, ok := daemonOf(c)
	if d.mps == nil || !ok {
		return specs.ContainerEdits{}, errors.New("its GpuConfig shares by MPS, and this nvinject-dra runs no MPS daemons; use strategy TimeSlicing")
	}
	pipe, shm := d.mps.Client(c.UID)
	m := spec.MPSClientEdits(spec.MPSShare{PipeDir: pipe, ShmDir: shm, ActiveThreadPercentage: dm.ActiveThreadPercentage, PinnedMemoryMiB: dm.PinnedMemoryMiB}, len(uuids))
	edits.Env = append(edits.Env, m.Env...)
	edits.Mounts = append(edits.Mounts, m.Mounts...)
	return edits, nil
}
