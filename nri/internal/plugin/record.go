package plugin

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/podresources"
)

// What a verdict's audit record says the container was found to have.

// assignment is kubelet's word on the container, as the record names it:
// device-plugin IDs by resource (nvidia.com/gpu, nvidia.com/mig-1g.10gb),
// and DRA devices as claim:pool/device.
func (h *Handler) assignment(c podresources.Container) audit.Assignment {
	a := audit.Assignment{Asked: true, Resource: h.resource}
	for _, d := range c.Devices {
		if h.serves(d.Resource) {
			a.Devices = append(a.Devices, audit.Devices{Resource: d.Resource, IDs: d.IDs})
		}
	}
	for _, cl := range h.ownClaims(c) {
		for _, d := range cl.Devices {
			a.Claims = append(a.Claims, cl.Namespace+"/"+cl.Name+":"+d.Pool+"/"+d.Device)
		}
	}
	return a
}

// gpuNodes names each way to a GPU or MIG capability the check saw
// (device node, bind mount, device cgroup rule) with its major:minor,
// sorted.
func gpuNodes(nodes []verify.Node) []string {
	var out []string
	for _, n := range nodes {
		switch {
		case !n.IsGPU() && !n.IsCaps():
		case strings.HasPrefix(n.Path, "device cgroup rule"): // names its numbers
			out = append(out, n.Path)
		default:
			out = append(out, fmt.Sprintf("%s %d:%d", n.Path, n.Major, n.Minor))
		}
	}
	slices.Sort(out)
	return out
}

// uuidEnv is the NVINJECT_GPU_UUID_* and NVINJECT_MIG_UUID_* part of env,
// sorted.
func uuidEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if strings.HasPrefix(kv, contract.EnvUUIDPrefix) || strings.HasPrefix(kv, contract.EnvMIGUUIDPrefix) {
			out = append(out, kv)
		}
	}
	slices.Sort(out)
	return out
}

// driverMounts counts the CDI spec's mounts (the driver's files) that the
// final container has, of all the spec names.
func driverMounts(res resolve.Result, mounts []*api.Mount) (found, want int) {
	if res.Spec == nil || len(res.Spec.Mounts) == 0 {
		return 0, 0
	}
	have := make(map[string]bool, len(mounts))
	for _, m := range mounts {
		have[m.GetDestination()] = true
	}
	seen := make(map[string]bool, len(res.Spec.Mounts))
	for _, m := range res.Spec.Mounts {
		if seen[m.Destination] {
			continue
		}
		seen[m.Destination] = true
		if have[m.Destination] {
			found++
		}
	}
	return found, len(seen)
}
