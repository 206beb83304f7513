package plugin

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/podresources"
)

// ReasonSharedClaim: a shared claim's own CDI device names a GPU the
// container does not get through that claim.
const ReasonSharedClaim = "shared-claim"

// isClaimDevice reports whether n is a per-claim CDI device of nvinject's
// vendor (<vendor>/claim=<claim UID>), which nvinject-dra writes for a
// shared claim.
func (h *Handler) isClaimDevice(n string) bool {
	return contract.IsKind(n, h.vendor, contract.CDIClaimClass)
}

// sharedClaim is the claim a per-claim CDI device stands for, and the GPUs
// and MIG devices it shares; share is the allocation's share ID when the
// claim holds a GPU share (consumable capacity).
type sharedClaim struct {
	uid   string
	uuids []string
	share string
	admin bool
}

// sharedClaimOf reads a resolved device's shared-claim annotations; ok is
// false for a device that is no claim's own (a GPU's, or another vendor's).
func (h *Handler) sharedClaimOf(d resolve.Device) (sharedClaim, bool) {
	uid := d.Annotations[contract.SharedClaimAnnotation]
	if uid == "" || d.Name != contract.SharedClaimDevice(h.vendor, uid) {
		return sharedClaim{}, false
	}
	return sharedClaim{uid: uid, uuids: contract.ParseSharedClaimUUIDs(d.Annotations[contract.SharedClaimUUIDsAnnotation]), share: d.Annotations[contract.GPUShareAnnotation],
		admin: d.Annotations[contract.AdminAccessAnnotation] == "true"}, true
}

// shares maps each GPU or MIG UUID that r's shared claims share to the
// claim. Each must be a GPU the container gets and, where kubelet
// was asked, one it gets through a GPU device of the same claim that names
// the claim's own device: a claim's device beside a GPU from elsewhere
// shares nothing and is refused.
func (h *Handler) shares(r *request) (map[string]sharedClaim, error) {
	out := map[string]sharedClaim{}
	got := verify.UUIDs(r.gpus)
	for _, d := range r.res.Devices {
		sc, ok := h.sharedClaimOf(d)
		if !ok {
			continue
		}
		var through []string
		if r.kubelet != nil {
			own := h.ownClaims(r.kubelet.own)
			i := slices.IndexFunc(own, func(cl podresources.Claim) bool { return slices.Contains(cl.CDIDevices(), d.Name) })
			if i < 0 {
				return nil, refuse(ReasonSharedClaim, fmt.Errorf("%s: CDI device %s of shared claim %s is in none of the container's claims in kubelet's PodResources; the pod must reference the ResourceClaim itself (spec.resourceClaims[].resourceClaimName)", r.who, d.Name, sc.uid))
			}
			through = h.claimGPUs(own[i].CDIDevices(), r.res)
		}
		for _, u := range sc.uuids {
			if !slices.Contains(got, u) || (r.kubelet != nil && !slices.Contains(through, u)) {
				return nil, refuse(ReasonSharedClaim, fmt.Errorf("%s: CDI device %s shares %s through claim %s, which the container does not get through that claim (it gets %s); a shared claim shares only its own GPUs: reference the claim for the GPU, not a GPU from elsewhere", r.who, d.Name, u, sc.uid, contract.List(got)))
			}
			if other, dup := out[u]; dup && other.uid != sc.uid {
				return nil, refuse(ReasonSharedClaim, fmt.Errorf("%s: %s is shared through claims %s and %s; a GPU is shared through one claim", r.who, u, other.uid, sc.uid))
			}
			out[u] = sc
		}
	}
	return out, nil
}

// claimGPUs are the UUIDs the GPU devices among names (one claim's CDI
// names) stand for, as resolved for the container.
func (h *Handler) claimGPUs(names []string, res resolve.Result) []string {
	var out []string
	for _, d := range res.Devices {
		if contract.IsKind(d.Name, h.vendor, h.class) && slices.Contains(names, d.Name) {
			out = append(out, deviceUUIDs(d)...)
		}
	}
	return out
}

// theirShares maps the UUIDs another pod's claim (its CDI names) shares to
// the claim, from the claim's own device in the spec.
func (h *Handler) theirShares(names []string) map[string]sharedClaim {
	out := map[string]sharedClaim{}
	for _, n := range names {
		if !h.isClaimDevice(n) {
			continue
		}
		d, ok := h.resolver.Device(n)
		if !ok {
			continue
		}
		if sc, ok := h.sharedClaimOf(d); ok {
			for _, u := range sc.uuids {
				out[u] = sc
			}
		}
	}
	return out
}

// runningShares is what a running container shares, for Synchronize: the
// claim its environment names (contract.EnvSharedClaim, set by the claim's
// own CDI device) and the UUIDs that claim's device in the spec shares.
func (h *Handler) runningShares(ctr *api.Container) map[string]sharedClaim {
	for _, kv := range ctr.GetEnv() {
		if uid, ok := strings.CutPrefix(kv, contract.EnvSharedClaim+"="); ok && uid != "" {
			return h.theirShares([]string{contract.SharedClaimDevice(h.vendor, uid)})
		}
	}
	return nil
}
