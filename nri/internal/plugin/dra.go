package plugin

import (
	"context"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/collect"
	"github.com/nvinject/nvinject/nri/internal/podresources"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/shared/contract"
)

// KubeletClaims reports the DRA ResourceClaims kubelet prepared for a
// container (PodResources dynamic_resources); the PodResources client
// satisfies it. A KubeletDevices without it checks device-plugin GPUs only.
type KubeletClaims interface {
	Claims(ctx context.Context, namespace, pod, ctr, driver string) ([]podresources.Claim, error)
}

// claimUUIDs is the DRA side of the kubelet comparison: the GPUs that
// nvinject-dra's claims prepared for ctr, as UUIDs (through the resolved
// devices' UUID env), and the claims named for refusals. A claimed CDI name
// the container does not resolve is kept as is, so the mismatch names it.
// No claims: nil, "".
func (h *Handler) claimUUIDs(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, res resolve.Result) ([]string, string, error) {
	kc, ok := h.kubelet.(KubeletClaims)
	if !ok {
		return nil, "", nil
	}
	claims, err := kc.Claims(ctx, pod.GetNamespace(), pod.GetName(), ctr.GetName(), contract.DRADriver)
	if err != nil || len(claims) == 0 {
		return nil, "", err
	}
	uuidOf := map[string]string{}
	for _, d := range res.Devices {
		for _, e := range d.Edits.Env {
			if k, v, _ := strings.Cut(e, "="); strings.HasPrefix(k, contract.EnvUUIDPrefix) {
				uuidOf[d.Name] = v
			}
		}
	}
	ids := []string{}
	names := make([]string, 0, len(claims))
	for _, c := range claims {
		names = append(names, c.String())
		for _, n := range c.CDIDevices() {
			if !collect.Kind(n, h.vendor, h.class) {
				continue
			}
			if u, ok := uuidOf[n]; ok {
				n = u
			}
			ids = append(ids, n)
		}
	}
	return ids, strings.Join(names, ", "), nil
}
