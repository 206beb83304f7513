package plugin

import (
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/podresources"
)

// claimNames returns the CDI names of our kind that claims prepared, a
// shared claim's own device included, and the claims named for refusals
// ("" for no claims).
func (h *Handler) claimNames(claims []podresources.Claim) ([]string, string) {
	var names, labels []string
	for _, c := range claims {
		labels = append(labels, c.String())
		for _, n := range c.CDIDevices() {
			if (contract.IsKind(n, h.vendor, h.class) || h.isClaimDevice(n)) && !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	return names, strings.Join(labels, ", ")
}

// hasNVIDIANode reports whether the container already has an NVIDIA
// character device (major 195), as containerd's own CDI injection leaves it.
func hasNVIDIANode(ctr *api.Container) bool {
	for _, d := range ctr.GetLinux().GetDevices() {
		if d.GetMajor() == gpu.NVIDIAMajor {
			return true
		}
	}
	return false
}

// claimUUIDs is the DRA side of the kubelet comparison: the GPUs claims
// prepared, as UUIDs (through the resolved devices' UUID env), and the
// claims named for refusals. A claimed CDI name the container does not
// resolve is kept as is, so the mismatch names it. No claims: nil, "".
func (h *Handler) claimUUIDs(claims []podresources.Claim, res resolve.Result) ([]string, string) {
	if len(claims) == 0 {
		return nil, ""
	}
	uuidsOf := map[string][]string{}
	for _, d := range res.Devices {
		uuidsOf[d.Name] = deviceUUIDs(d)
	}
	ids := []string{}
	names := make([]string, 0, len(claims))
	for _, c := range claims {
		names = append(names, c.String())
		for _, n := range c.CDIDevices() {
			if !contract.IsKind(n, h.vendor, h.class) {
				continue
			}
			if us := uuidsOf[n]; len(us) > 0 {
				ids = append(ids, us...)
			} else {
				ids = append(ids, n)
			}
		}
	}
	return ids, strings.Join(names, ", ")
}

// serves says whether resource is the GPUs': the device plugin's resource
// or one of its MIG resources (nvidia.com/mig-1g.10gb), not another
// domain's.
func (h *Handler) serves(resource string) bool {
	return resource == h.resource || strings.HasPrefix(resource, contract.MIGResourceName(h.resource, ""))
}

// ownIDs are the device-plugin IDs kubelet assigned c of the GPUs'
// resources, sorted.
func (h *Handler) ownIDs(c podresources.Container) []string { return c.IDs(h.serves) }

// ownClaims are c's claims of nvinject's DRA driver, with its devices only.
func (h *Handler) ownClaims(c podresources.Container) []podresources.Claim {
	return c.ClaimsOf(contract.DRADriver)
}

// howToRequest names the resources that request the GPUs names name: the
// device plugin's, or a MIG device's own (nvidia.com/mig-1g.10gb).
func (h *Handler) howToRequest(names []string) string {
	var out []string
	for _, n := range names {
		r := h.resource
		if _, id, _ := strings.Cut(n, "="); strings.HasPrefix(id, "MIG-") {
			r = contract.MIGResourceName(h.resource, "<profile>")
			if inv := h.inv(); inv != nil {
				if s, ok := inv.MIG[id]; ok {
					r = contract.MIGResourceName(h.resource, s.Profile)
				}
			}
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return strings.Join(out, " or ")
}
