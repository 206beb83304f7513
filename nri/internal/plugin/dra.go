package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/podresources"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// kubeletView is one PodResources List: every pod kubelet lists, and what
// it assigned the container asked about.
type kubeletView struct {
	pods []podresources.Pod
	own  podresources.Container
}

// askKubelet lists kubelet's assignments once for a container. kubelet
// hands a DRA claim's CDI names to containerd only in the CRI CDIDevices
// field, which containerd applies itself without passing the names to NRI:
// so a container that has NVIDIA device nodes but no names asks kubelet.
func (h *Handler) askKubelet(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*kubeletView, error) {
	pods, err := h.kubelet.List(ctx, h.resource, contract.DRADriver)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(pods, func(p podresources.Pod) bool { return p.Namespace == pod.GetNamespace() && p.Name == pod.GetName() })
	if i < 0 {
		return nil, fmt.Errorf("kubelet's PodResources lists no pod %s/%s; check that --pod-resources-socket is this node's kubelet", pod.GetNamespace(), pod.GetName())
	}
	return &kubeletView{pods: pods, own: pods[i].Container(ctr.GetName())}, nil
}

// claimNames returns the CDI names of our kind that claims prepared, and
// the claims named for refusals ("" for no claims).
func (h *Handler) claimNames(claims []podresources.Claim) ([]string, string) {
	var names, labels []string
	for _, c := range claims {
		labels = append(labels, c.String())
		for _, n := range c.CDIDevices() {
			if contract.IsKind(n, h.vendor, h.class) && !slices.Contains(names, n) {
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
