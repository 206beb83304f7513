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

	"github.com/nvinject/nvinject/nri/internal/audit"
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
	c, err := within(ctx, h, "ValidateContainerAdjustment", func(ctx context.Context) (checked, error) {
		return h.validate(ctx, pod, ctr, req.GetAdjust())
	})
	if err != nil {
		h.refused(pod, ctr, c.rec, err)
		return err
	}
	if len(c.uuids) > 0 {
		// Checked and recorded here, after the deadline's work: a check
		// that overran must not record a container the runtime refused.
		if o, u, busy := h.holders.admit(ctr.GetId(), holderOf(pod, ctr, c.uuids)); busy {
			err := refuse(ReasonHeld, fmt.Errorf("container %s of pod %s/%s: %w", ctr.GetName(), pod.GetNamespace(), pod.GetName(),
				heldError(u, "container "+o.ctr+" of pod "+o.pod, "as a running container seen by nvinject-nri")))
			h.refused(pod, ctr, c.rec, err)
			return err
		}
		h.admitted(pod, ctr, c.rec, c.uuids)
	}
	return nil
}

// checked is the validation's result: the GPUs checked and the record of
// what was found.
type checked struct {
	uuids []string
	rec   audit.Record
}

func (h *Handler) validate(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, adj *api.ContainerAdjustment) (c checked, err error) {
	c.rec.Assigned.NotAsked = notAsked
	who := fmt.Sprintf("container %s of pod %s/%s", ctr.GetName(), pod.GetNamespace(), pod.GetName())
	if !h.handlers[pod.GetRuntimeHandler()] {
		// Outside the served handlers CreateContainer has refused every
		// request of nvinject's GPUs; another plugin may not add one.
		in := verify.Input{Nodes: gpuAccess(adj.GetLinux().GetDevices(), adj.GetMounts(), adj.GetLinux().GetResources().GetDevices())}
		c.rec.Assigned.NotAsked = "not a GPU runtime handler"
		c.rec.Checked, c.rec.Devices = true, gpuNodes(in.Nodes)
		if err := verify.Check(in); err != nil {
			return c, refuse(reasonOf(err), fmt.Errorf("%s (runtime handler %q): an NRI plugin adds a GPU: %w", who, pod.GetRuntimeHandler(), err))
		}
		return c, wildcard(who, adj.GetLinux().GetResources().GetDevices())
	}
	names, err := h.collector.Container(ctr)
	if err != nil {
		return c, refuse(ReasonBadRequest, err)
	}
	c.rec.CDI = names
	// A DRA container: containerd applied its claims' CDI names itself.
	// kubelet is asked once (one List) and serves the comparison and the
	// check for other pods holding the GPU below too.
	var kv *kubeletView
	named := false
	if len(names) == 0 && hasNVIDIANode(ctr) && h.kubelet != nil {
		if kv, err = h.askKubelet(ctx, pod, ctr); err != nil {
			return c, refuse(ReasonKubeletDown, fmt.Errorf("%s: %w", who, err))
		}
		c.rec.Assigned = h.assignment(kv.own)
		var held string
		if names, held = h.claimNames(kv.own.Claims); held != "" {
			who, named = who+" ("+held+")", true
		}
		c.rec.CDI = names
	}
	var res resolve.Result
	if len(names) > 0 {
		if res, err = h.resolver.Resolve(names, userOf(ctr)); err != nil {
			var unres *resolve.UnresolvableError
			if errors.As(err, &unres) {
				return c, refuse(ReasonUnresolvable, fmt.Errorf("%s: %w", who, err))
			}
			return c, refuse(ReasonSpec, fmt.Errorf("%s: %w", who, err))
		}
	}
	gpus, err := allocated(res)
	if err != nil {
		return c, refuse(reasonOf(err), fmt.Errorf("%s: %w", who, err))
	}
	final := finalContainer(ctr, adj)
	in := verify.Input{Allocated: gpus, Nodes: gpuAccess(final.nodes, final.mounts, final.cgroup), Env: final.env, Inventory: h.inventory}
	// What was found goes into the record only for a verdict that is
	// recorded: a container without GPUs that passes records nothing.
	found := func() {
		c.rec.Checked, c.rec.Devices, c.rec.Env = true, gpuNodes(in.Nodes), uuidEnv(in.Env)
		c.rec.DriverMounts, c.rec.SpecMounts = driverMounts(res, final.mounts)
	}
	if err := wildcard(who, final.cgroup); err != nil {
		found()
		return c, err
	}
	switch {
	case h.kubelet == nil:
		c.rec.Assigned.NotAsked = "no --pod-resources-socket"
	case len(gpus) == 0 && kv == nil:
		c.rec.Assigned.NotAsked = "the container names no GPU"
	}
	// Only GPU containers ask kubelet: a container without GPUs has nothing
	// to compare, and the check refuses any GPU node in it.
	if h.kubelet != nil && len(gpus) > 0 {
		if kv == nil {
			if kv, err = h.askKubelet(ctx, pod, ctr); err != nil {
				found()
				return c, refuse(ReasonKubeletDown, fmt.Errorf("%s: %w", who, err))
			}
			c.rec.Assigned = h.assignment(kv.own)
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
		found()
		return c, refuse(reasonOf(err), fmt.Errorf("%s: %w", who, err))
	}
	if c.uuids = verify.UUIDs(gpus); len(c.uuids) > 0 {
		found()
	}
	if kv != nil {
		if err := h.heldInKubelet(kv, pod, c.uuids, res); err != nil {
			return c, refuse(ReasonHeld, fmt.Errorf("%s: %w", who, err))
		}
	}
	return c, nil
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
