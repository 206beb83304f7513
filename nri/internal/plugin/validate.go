package plugin

import (
	"context"
	"fmt"
	"slices"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/ledger"
	"github.com/nvinject/nvinject/nri/internal/verify"
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
		if clash, ok := h.ledger.Admit(ctr.GetId(), holderOf(pod, ctr, c.units)); !ok {
			o, mine, theirs := clash.Holder, clash.Mine, clash.Theirs
			who, via := "container "+o.Ctr+" of pod "+o.Pod, "as a running container seen by nvinject-nri"
			if o.Ctr == "" {
				who, via = "pods "+o.Pod, "as running containers seen by nvinject-nri"
			}
			err := refuse(ReasonHeld, fmt.Errorf("container %s of pod %s/%s: %w", ctr.GetName(), pod.GetNamespace(), pod.GetName(),
				h.heldError(mine, theirs, who, via)))
			h.refused(pod, ctr, c.rec, err)
			return err
		}
		if slices.ContainsFunc(c.units, func(u ledger.Unit) bool { return u.Admin }) {
			c.rec.Admin, c.rec.Beside = true, h.ledger.Beside(holderOf(pod, ctr, c.units))
		}
		h.admitted(pod, ctr, c.rec, c.uuids)
	}
	return nil
}

// checked is the validation's result: the GPUs and MIG devices checked
// (and as held, with their parents) and the record of what was found.
type checked struct {
	uuids []string
	units []ledger.Unit
	rec   audit.Record
}

func (h *Handler) validate(ctx context.Context, pod *api.PodSandbox, ctr *api.Container, adj *api.ContainerAdjustment) (c checked, err error) {
	if !h.handlers[pod.GetRuntimeHandler()] {
		// Outside the served handlers CreateContainer has refused every
		// request of nvinject's GPUs; another plugin may not add one.
		who := fmt.Sprintf("container %s of pod %s/%s", ctr.GetName(), pod.GetNamespace(), pod.GetName())
		added := finalOf(nil, adj)
		in := verify.Input{Nodes: added.access()}
		c.rec.Assigned.NotAsked = "not a GPU runtime handler"
		c.rec.Checked, c.rec.Devices = true, gpuNodes(in.Nodes)
		if err := verify.Check(in); err != nil {
			return c, refuse(reasonOf(err), fmt.Errorf("%s (runtime handler %q): an NRI plugin adds a GPU: %w", who, pod.GetRuntimeHandler(), err))
		}
		return c, added.wildcard(who)
	}
	// The request CreateContainer built; built here only if it is gone.
	r := h.requests.take(pod, ctr)
	if r == nil {
		if r, err = h.build(ctx, pod, ctr); err != nil {
			c.rec = h.record(r)
			return c, err
		}
	}
	c.rec = h.record(r)
	who := r.who
	final := finalOf(ctr, adj)
	in := verify.Input{Allocated: r.gpus, Nodes: final.access(), Env: final.env}
	// What was found goes into the record only for a verdict that is
	// recorded: a container without GPUs that passes records nothing.
	found := func() {
		c.rec.Checked, c.rec.Devices, c.rec.Env = true, gpuNodes(in.Nodes), uuidEnv(in.Env)
		c.rec.DriverMounts, c.rec.SpecMounts = driverMounts(r.res, final.mounts)
	}
	if err := final.wildcard(who); err != nil {
		found()
		return c, err
	}
	switch {
	case h.kubelet == nil:
		c.rec.Assigned.NotAsked = "no --pod-resources-socket"
	case len(r.gpus) == 0 && r.kubelet == nil:
		c.rec.Assigned.NotAsked = "the container names no GPU"
	}
	// Only GPU containers ask kubelet: a container without GPUs has nothing
	// to compare, and the check refuses any GPU node in it. A DRA
	// container's request asked already and serves the comparison and the
	// check for other pods holding the GPU below with the same List.
	if h.kubelet != nil && len(r.gpus) > 0 {
		if err := h.ask(ctx, r, pod, ctr); err != nil {
			found()
			return c, refuse(ReasonKubeletDown, fmt.Errorf("%s: %w", who, err))
		}
		c.rec.Assigned = h.assignment(r.kubelet.own)
		ids := h.ownIDs(r.kubelet.own)
		in.Kubelet = h.kubeletUUIDs(ids, r.res)
		if len(ids) == 0 {
			// No device-plugin GPU: the DRA driver's claims are kubelet's word.
			if uuids, held := h.claimUUIDs(h.ownClaims(r.kubelet.own), r.res); held != "" {
				in.Kubelet = uuids
				if r.claims == "" {
					who += " (" + held + ")"
				}
			}
		}
	}
	if err := h.verifyInput(ctx, in); err != nil {
		found()
		return c, refuse(reasonOf(err), fmt.Errorf("%s: %w", who, err))
	}
	if c.uuids = verify.UUIDs(r.gpus); len(c.uuids) > 0 {
		found()
	}
	shares, err := h.shares(r)
	if err != nil {
		return c, err
	}
	if err := h.checkShare(r, final); err != nil {
		return c, err
	}
	c.units = h.units(c.uuids, r.gpus, shares)
	if r.kubelet != nil {
		if err := h.heldInKubelet(r.kubelet, pod, c.units, r.res); err != nil {
			return c, refuse(ReasonHeld, fmt.Errorf("%s: %w", who, err))
		}
	}
	return c, nil
}
