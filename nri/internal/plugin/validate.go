package plugin

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/gpu"
)

// ValidateContainerAdjustment checks the container as it will run, after
// every NRI plugin's adjustment: the GPUs it gets, by device node, bind
// mount of a GPU node or device cgroup rule, must be exactly the ones
// allocated to it, the UUID environment must agree and, when configured,
// kubelet's PodResources too; and no other live pod may hold them, in
// kubelet's PodResources or as a GPU container admitted here that still
// runs. The runtime calls it after all plugins' CreateContainer; an error,
// a timeout or this plugin being gone fails the creation.
func (h *Handler) ValidateContainerAdjustment(ctx context.Context, req *api.ValidateContainerAdjustmentRequest) error {
	pod, ctr := req.GetPod(), req.GetContainer()
	uuids, err := within(ctx, h, "ValidateContainerAdjustment", func(ctx context.Context) ([]string, error) {
		return h.validate(ctx, pod, ctr, req.GetAdjust())
	})
	if err != nil {
		h.refused(pod, ctr, err)
		return err
	}
	if len(uuids) > 0 {
		// Checked and recorded here, after the deadline's work: a check
		// that overran must not record a container the runtime refused.
		if o, u, busy := h.holders.admit(ctr.GetId(), holderOf(pod, ctr, uuids)); busy {
			err := refuse(ReasonHeld, fmt.Errorf("container %s of pod %s/%s: %w", ctr.GetName(), pod.GetNamespace(), pod.GetName(),
				heldError(u, "container "+o.ctr+" of pod "+o.pod, "as a running container seen by nvinject-nri")))
			h.refused(pod, ctr, err)
			return err
		}
		if h.metrics != nil {
			h.metrics.Injected()
		}
		h.log.Info("injected GPUs", append(h.attrs(pod, ctr), "uuids", uuids)...)
	}
	return nil
}

func (h *Handler) validate(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, adj *api.ContainerAdjustment) ([]string, error) {
	who := fmt.Sprintf("container %s of pod %s/%s", ctr.GetName(), pod.GetNamespace(), pod.GetName())
	if !h.handlers[pod.GetRuntimeHandler()] {
		// Outside the served handlers CreateContainer has refused every
		// request of nvinject's GPUs; another plugin may not add one.
		in := verify.Input{Nodes: gpuAccess(adj.GetLinux().GetDevices(), adj.GetMounts(), adj.GetLinux().GetResources().GetDevices())}
		if err := verify.Check(in); err != nil {
			return nil, refuse(reasonOf(err), fmt.Errorf("%s (runtime handler %q): an NRI plugin adds a GPU: %w", who, pod.GetRuntimeHandler(), err))
		}
		return nil, wildcard(who, adj.GetLinux().GetResources().GetDevices())
	}
	names, err := h.collector.Container(ctr)
	if err != nil {
		return nil, refuse(ReasonBadRequest, err)
	}
	// A DRA container: containerd applied its claims' CDI names itself.
	// kubelet is asked once (one List) and serves the comparison and the
	// check for other pods holding the GPU below too.
	var kv *kubeletView
	named := false
	if len(names) == 0 && hasNVIDIANode(ctr) && h.kubelet != nil {
		if kv, err = h.askKubelet(ctx, pod, ctr); err != nil {
			return nil, refuse(ReasonKubeletDown, fmt.Errorf("%s: %w", who, err))
		}
		var held string
		if names, held = h.claimNames(kv.own.Claims); held != "" {
			who, named = who+" ("+held+")", true
		}
	}
	var res resolve.Result
	if len(names) > 0 {
		if res, err = h.resolver.Resolve(names, userOf(ctr)); err != nil {
			var unres *resolve.UnresolvableError
			if errors.As(err, &unres) {
				return nil, refuse(ReasonUnresolvable, fmt.Errorf("%s: %w", who, err))
			}
			return nil, refuse(ReasonSpec, fmt.Errorf("%s: %w", who, err))
		}
	}
	gpus, err := allocated(res)
	if err != nil {
		return nil, refuse(reasonOf(err), fmt.Errorf("%s: %w", who, err))
	}
	final := finalContainer(ctr, adj)
	if err := wildcard(who, final.cgroup); err != nil {
		return nil, err
	}
	in := verify.Input{Allocated: gpus, Nodes: gpuAccess(final.nodes, final.mounts, final.cgroup), Env: final.env, Inventory: h.inventory}
	// Only GPU containers ask kubelet: a container without GPUs has nothing
	// to compare, and the check refuses any GPU node in it.
	if h.kubelet != nil && len(gpus) > 0 {
		if kv == nil {
			if kv, err = h.askKubelet(ctx, pod, ctr); err != nil {
				return nil, refuse(ReasonKubeletDown, fmt.Errorf("%s: %w", who, err))
			}
		}
		ids := kv.own.DeviceIDs
		in.Kubelet = kubeletUUIDs(ids, res)
		if len(ids) == 0 {
			// No device-plugin GPU: the DRA driver's claims are kubelet's word.
			if uuids, held := h.claimUUIDs(kv.own.Claims, res); held != "" {
				in.Kubelet = uuids
				if !named {
					who += " (" + held + ")"
				}
			}
		}
	}
	if err := verify.Check(in); err != nil {
		return nil, refuse(reasonOf(err), fmt.Errorf("%s: %w", who, err))
	}
	uuids := verify.UUIDs(gpus)
	if kv != nil {
		if err := h.heldInKubelet(kv, pod, uuids, res); err != nil {
			return nil, refuse(ReasonHeld, fmt.Errorf("%s: %w", who, err))
		}
	}
	return uuids, nil
}

// final is a container as it will run, after the adjustment.
type final struct {
	nodes  []*api.LinuxDevice
	mounts []*api.Mount
	cgroup []*api.LinuxDeviceCgroup
	env    []string
}

// finalContainer applies adj to ctr the way the runtime does: an adjusted
// device or variable replaces the container's of the same path or name;
// mounts and device cgroup rules add up.
func finalContainer(ctr *api.Container, adj *api.ContainerAdjustment) final {
	byPath := map[string]*api.LinuxDevice{}
	var order []string
	for _, d := range slices.Concat(ctr.GetLinux().GetDevices(), adj.GetLinux().GetDevices()) {
		if _, ok := byPath[d.GetPath()]; !ok {
			order = append(order, d.GetPath())
		}
		byPath[d.GetPath()] = d
	}
	f := final{
		mounts: slices.Concat(ctr.GetMounts(), adj.GetMounts()),
		cgroup: slices.Concat(ctr.GetLinux().GetResources().GetDevices(), adj.GetLinux().GetResources().GetDevices()),
		env:    finalEnv(ctr, adj),
	}
	for _, p := range order {
		f.nodes = append(f.nodes, byPath[p])
	}
	return f
}

var gpuNodePath = regexp.MustCompile(`^/dev/nvidia([0-9]+)$`)

// gpuAccess lists every way the container reaches a GPU: device nodes,
// bind mounts of a host /dev/nvidiaN, and device cgroup rules that grant
// read or write on one GPU (195:N).
func gpuAccess(nodes []*api.LinuxDevice, mounts []*api.Mount, rules []*api.LinuxDeviceCgroup) []verify.Node {
	var out []verify.Node
	for _, d := range nodes {
		out = append(out, verify.Node{Path: d.GetPath(), Type: d.GetType(), Major: d.GetMajor(), Minor: d.GetMinor()})
	}
	for _, m := range mounts {
		if g := gpuNodePath.FindStringSubmatch(m.GetSource()); g != nil {
			minor, err := strconv.ParseInt(g[1], 10, 64)
			if err == nil {
				out = append(out, verify.Node{Path: "bind mount of " + m.GetSource(), Type: "c", Major: gpu.NVIDIAMajor, Minor: minor})
			}
		}
	}
	for _, r := range rules {
		if grants(r) && r.GetMajor() != nil && r.GetMinor() != nil && r.GetType() != "b" {
			out = append(out, verify.Node{Path: fmt.Sprintf("device cgroup rule %d:%d", r.GetMajor().GetValue(), r.GetMinor().GetValue()),
				Type: "c", Major: r.GetMajor().GetValue(), Minor: r.GetMinor().GetValue()})
		}
	}
	return out
}

// wildcard refuses a device cgroup rule that grants read or write on every
// GPU at once (any major, or major 195 with any minor).
func wildcard(who string, rules []*api.LinuxDeviceCgroup) error {
	for _, r := range rules {
		if !grants(r) || r.GetType() == "b" {
			continue
		}
		if r.GetMajor() == nil || (r.GetMajor().GetValue() == gpu.NVIDIAMajor && r.GetMinor() == nil) {
			return refuse(string(verify.ReasonForeignGPU), fmt.Errorf("%s: a device cgroup rule (type %q, access %q) grants every GPU; remove it or the privileged setting", who, r.GetType(), r.GetAccess()))
		}
	}
	return nil
}

// grants reports an allow rule giving read or write access.
func grants(r *api.LinuxDeviceCgroup) bool {
	return r.GetAllow() && strings.ContainsAny(r.GetAccess(), "rw")
}
