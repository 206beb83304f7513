package driver

import (
	"context"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/claimconfig"
	"github.com/nvinject/nvinject/shared/contract"
)

// PrepareResourceClaims answers NodePrepareResources: each claim's devices
// of this driver become their names in the shared CDI spec (a MIG device's
// own, by its MIG UUID). A claim
// prepared before (by this process or an earlier one) gets the
// checkpointed answer again; a new one is checked (this node's pool, a
// published device, its GPU Healthy, not held by another claim) and checkpointed
// before the answer leaves. A claim whose GpuConfig shares its devices
// (TimeSlicing) also gets its own CDI device, <vendor>/claim=<UID>, in a
// per-claim spec, named beside each shared device: the pods of that claim
// may then share its GPUs (nvinject-nri checks it). MPS is refused.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		res, err := d.prepare(ctx, c)
		if err != nil {
			d.metrics.Prepared("error")
			d.log.WarnContext(ctx, "claim not prepared", "claim", c.Namespace+"/"+c.Name, "claim_uid", string(c.UID), "error", err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: contract.Bound(err)}
			continue
		}
		d.metrics.Prepared("ok")
		out[c.UID] = res
	}
	d.metrics.SetPreparedClaims(d.state.Len())
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) (kubeletplugin.PrepareResult, error) {
	name := c.Namespace + "/" + c.Name
	if cp, ok := d.state.Get(string(c.UID)); ok && !cp.Pending {
		return resultOf(cp), nil
	}
	if c.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s is not allocated; the scheduler allocates it before the pod reaches the node", name)
	}
	var requests []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == d.driver {
			requests = append(requests, r.Request)
		}
	}
	configs, err := claimconfig.ForRequests(name, c.Status.Allocation.Devices.Config, requests)
	if err != nil {
		return kubeletplugin.PrepareResult{}, err
	}
	held := d.heldBy()
	healthy := map[string]string{}
	for _, s := range d.health.States() {
		healthy[s.UUID] = s.Reason
	}
	cp := checkpoint.Claim{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.driver {
			continue
		}
		if r.Pool != d.pool {
			return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s: device %s is from pool %s, not this node's pool %s; the claim was allocated for another node", name, contract.Quote(r.Device), contract.Quote(r.Pool), d.pool)
		}
		dev, ok := d.byName[r.Device]
		if !ok {
			return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s: device %s is not published on this node (published: %s); the ResourceSlice changed after allocation: delete the pod so the claim is allocated again", name, contract.Quote(r.Device), contract.List(d.names()))
		}
		admin := r.AdminAccess != nil && *r.AdminAccess
		if err := d.checkExclusive(ctx, held, dev, admin); err != nil {
			return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s: %w", name, err)
		}
		if reason := healthy[dev.UUID]; reason != "" {
			return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s: %s is Unhealthy (%s); the claim was allocated before its taint: delete the pod so the claim gets a healthy GPU", name, dev.Describe(), reason)
		}
		pd := checkpoint.Device{
			Requests: []string{r.Request}, Pool: r.Pool, Device: dev.Name, UUID: dev.ID(),
			CDIDeviceIDs: []string{dev.CDIName}, AdminAccess: admin, Sharing: string(configs[r.Request].Strategy()),
			MPS: mpsLimits(configs[r.Request]),
		}
		if s := dev.Slot; s != nil {
			pd.UUID, pd.CDIDeviceIDs = "", nil
			pd.MIG = &checkpoint.MIGSlot{ParentUUID: dev.UUID, ParentIndex: dev.Index, Profile: s.Profile, GIProfile: s.GIProfile, Start: s.Placement.Start, Size: s.Placement.Size}
			if admin {
				return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s: %s has no MIG device until a claim makes one; admin access is served on whole GPUs and existing MIG devices: ask for the parent GPU (%s)", name, dev.Describe(), DeviceName(dev.Device))
			}
			cp.Pending = true
		}
		switch {
		case dev.Share && admin:
			// A monitor of a GPU in shares: kubelet gets its share ID
			// back; it runs as no share's MPS client.
			if r.ShareID != nil {
				pd.ShareID = string(*r.ShareID)
			}
		case dev.Share:
			if err := d.shareDevice(&pd, dev, r, configs[r.Request]); err != nil {
				return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s: %w", name, err)
			}
		}
		cp.Devices = append(cp.Devices, pd)
	}
	if err := oneShare(cp); err != nil {
		return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s: %w", name, err)
	}
	made := cp.Pending
	if err := d.makeMIG(ctx, &cp); err != nil {
		return kubeletplugin.PrepareResult{}, fmt.Errorf("ResourceClaim %s: %w", name, err)
	}
	// What a failure below leaves: the MIG devices made for the claim go.
	undo := func() error {
		if !made {
			return nil
		}
		return d.dropMIG(ctx, cp)
	}
	if err := d.share(ctx, &cp); err != nil {
		return kubeletplugin.PrepareResult{}, errors.Join(fmt.Errorf("ResourceClaim %s: %w", name, err), undo())
	}
	if err := d.state.Put(cp); err != nil {
		return kubeletplugin.PrepareResult{}, errors.Join(fmt.Errorf("ResourceClaim %s: %w", name, err), d.unshare(cp.UID), undo())
	}
	d.log.Info("claim prepared", "claim", name, "claim_uid", cp.UID, "devices", deviceNames(cp))
	return resultOf(cp), nil
}

// checkExclusive refuses dev when a live claim holds it, or holds its GPU
// the other way (whole beside shares), unless the claim asks for admin
// access. Shares of one GPU's share device do not exclude each other.
func (d *Driver) checkExclusive(ctx context.Context, held map[string][]checkpoint.Claim, dev Device, admin bool) error {
	if admin {
		return nil
	}
	var names []string
	switch {
	case dev.Share:
		names = []string{DeviceName(dev.Device)}
	case dev.MIG == nil && d.shares:
		names = []string{dev.Name, contract.DRAShareDeviceName(dev.Index)}
	default:
		names = []string{dev.Name}
	}
	for _, n := range names {
		for _, other := range held[n] {
			if err := d.checkHolder(ctx, dev, other, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkHolder refuses dev while claim other, which holds device n, is live.
func (d *Driver) checkHolder(ctx context.Context, dev Device, other checkpoint.Claim, n string) error {
	live, err := d.claimLive(ctx, other, n)
	if err != nil {
		return fmt.Errorf("%s is still prepared for ResourceClaim %s and its state is unknown: %w", dev.Describe(), other, err)
	}
	switch {
	case live && n != dev.Name:
		return fmt.Errorf("%s: its GPU is already prepared for ResourceClaim %s as %s; a GPU is given whole or in shares, never both: delete one of the pods", dev.Describe(), other, n)
	case live:
		return fmt.Errorf("%s is already prepared for ResourceClaim %s; one device serves one claim: delete one of the pods", dev.Describe(), other)
	}
	d.log.Info("device still prepared for a claim that no longer holds it (kubelet unprepares it later)", "stale_claim", other.String(), "device", n)
	return nil
}

// heldBy maps each device held by prepared claims without admin access to
// those claims (several: a share device).
func (d *Driver) heldBy() map[string][]checkpoint.Claim {
	out := map[string][]checkpoint.Claim{}
	for _, c := range d.state.All() {
		for _, dev := range c.Devices {
			if !dev.AdminAccess {
				out[dev.Device] = append(out[dev.Device], c)
			}
		}
	}
	return out
}

// claimLive reports whether prepared claim c still holds device in the API:
// allocated to it and reserved for a pod. A deleted pod's claim is released
// (and the GPU allocated anew) before kubelet unprepares it. Without a ClaimLookup every prepared
// claim counts as live.
func (d *Driver) claimLive(ctx context.Context, c checkpoint.Claim, device string) (bool, error) {
	if d.lookup == nil {
		return true, nil
	}
	got, err := d.lookup(ctx, c.Namespace, c.Name)
	if err != nil || got == nil {
		return got != nil, err
	}
	if string(got.UID) != c.UID || got.DeletionTimestamp != nil || got.Status.Allocation == nil || len(got.Status.ReservedFor) == 0 {
		return false, nil
	}
	for _, r := range got.Status.Allocation.Devices.Results {
		if r.Driver == d.driver && r.Pool == d.pool && r.Device == device {
			return true, nil
		}
	}
	return false, nil
}

func (d *Driver) names() []string {
	out := make([]string, len(d.devices))
	for i, g := range d.devices {
		out[i] = g.Name
	}
	return out
}

func deviceNames(c checkpoint.Claim) []string {
	out := make([]string, len(c.Devices))
	for i, dev := range c.Devices {
		out[i] = dev.Device + "=" + dev.UUID
	}
	return out
}

// unshare removes claim uid's own CDI spec, if it has one.
func (d *Driver) unshare(uid string) error {
	if d.claimSpecs == nil {
		return nil
	}
	if err := d.claimSpecs.Remove(uid); err != nil {
		return err
	}
	return d.syncMPS(func(c checkpoint.Claim) bool { return c.UID != uid }, nil)
}

func resultOf(c checkpoint.Claim) kubeletplugin.PrepareResult {
	res := kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{}}
	for _, dev := range c.Devices {
		res.Devices = append(res.Devices, kubeletplugin.Device{
			Requests: dev.Requests, PoolName: dev.Pool, DeviceName: dev.Device, CDIDeviceIDs: dev.CDIDeviceIDs,
			ShareID: shareID(dev.ShareID),
		})
	}
	return res
}

// UnprepareResourceClaims answers NodeUnprepareResources: it forgets the
// claims. A claim that is not prepared (already unprepared, or never
// prepared here) is not an error.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		// The claim's own CDI spec goes first: a failure leaves the claim
		// prepared, so kubelet's retry removes it.
		if err := d.unshare(string(c.UID)); err != nil {
			d.metrics.Unprepared("error")
			out[c.UID] = fmt.Errorf("ResourceClaim %s: %w", c.NamespacedName.String(), err)
			continue
		}
		// Its MIG devices made on demand go before the claim is forgotten:
		// a failure leaves it prepared for kubelet's retry.
		if cp, ok := d.state.Get(string(c.UID)); ok {
			if err := d.destroyMIG(ctx, cp); err != nil {
				d.metrics.Unprepared("error")
				out[c.UID] = err
				continue
			}
		}
		had, err := d.state.Delete(string(c.UID))
		switch {
		case err != nil:
			d.metrics.Unprepared("error")
			out[c.UID] = fmt.Errorf("ResourceClaim %s: %w", c.NamespacedName.String(), err)
		case had:
			d.metrics.Unprepared("ok")
			d.log.InfoContext(ctx, "claim unprepared", "claim", c.NamespacedName.String(), "claim_uid", string(c.UID))
			out[c.UID] = nil
		default:
			d.metrics.Unprepared("not-prepared")
			out[c.UID] = nil
		}
	}
	d.metrics.SetPreparedClaims(d.state.Len())
	return out, nil
}
