package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/podresources"
	"github.com/nvinject/nvinject/shared/sharing"
)

// request is one container's GPU request: what it names, kubelet's word
// on it, what the names resolve to and the GPUs they stand for. It is
// built once: CreateContainer injects its edits and checks them early, and
// hands it to the check of the final container (requests), so the two
// resolve once and ask kubelet at most once.
type request struct {
	// What it was built for: a validation of another pod's container
	// builds its own.
	podUID, sandbox, ctr string
	// who names the container in refusals, with the claims its names
	// came from.
	who string
	// names are the CDI names requested: the container's own, else those
	// its DRA claims prepared.
	names []string
	// claims names those claims ("" for none).
	claims string
	// kubelet is kubelet's one List, nil until asked.
	kubelet *kubeletView
	res     resolve.Result
	gpus    []verify.GPU
}

// kubeletView is one PodResources List: every pod kubelet lists, and what
// it assigned the container asked about.
type kubeletView struct {
	pods []podresources.Pod
	own  podresources.Container
}

// build builds the container's request, or refuses it. kubelet is asked
// here only for a container that has NVIDIA device nodes but names no CDI
// device: kubelet hands a DRA claim's CDI names to containerd only in the
// CRI CDIDevices field, which containerd applies itself without passing
// the names to NRI. Outside the served runtime handlers the names are all
// there is: they can only refuse the container.
func (h *Handler) build(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*request, error) {
	r := &request{podUID: pod.GetUid(), sandbox: pod.GetId(), ctr: ctr.GetName(),
		who: fmt.Sprintf("container %s of pod %s/%s", ctr.GetName(), pod.GetNamespace(), pod.GetName())}
	names, err := h.collector.Container(ctr)
	if err != nil {
		return r, refuse(ReasonBadRequest, err)
	}
	r.names = names
	served := h.handlers[pod.GetRuntimeHandler()]
	if len(names) == 0 && hasNVIDIANode(ctr) && h.kubelet != nil {
		switch err := h.ask(ctx, r, pod, ctr); {
		case err != nil && served:
			return r, refuse(ReasonKubeletDown, fmt.Errorf("%s: %w", r.who, err))
		case err != nil:
			// Outside the served handlers the claims only name a refusal:
			// a privileged system pod sees the host's NVIDIA nodes too, and
			// must not fail with kubelet's PodResources.
			h.log.Warn("cannot ask kubelet whether a container outside the nvidia runtime class holds a DRA GPU; admitting it", append(h.attrs(pod, ctr), "error", err.Error())...)
		default:
			if r.names, r.claims = h.claimNames(h.ownClaims(r.kubelet.own)); r.claims != "" {
				r.who += " (" + r.claims + ")"
			}
		}
	}
	if !served {
		return r, nil
	}
	if spoofed := h.podLevel(pod, r.names); len(spoofed) > 0 {
		return r, refuse(ReasonPodLevel, fmt.Errorf("%s: pod-level annotations name GPUs %s that were not allocated to the container; remove them from the pod (request them with resources.limits %s, or through a DRA claim)",
			r.who, contract.List(spoofed), h.howToRequest(spoofed)))
	}
	if r.res, r.gpus, err = h.resolve(r.names, ctr); err != nil {
		reason := reasonOf(err)
		var unres *resolve.UnresolvableError
		switch {
		case errors.As(err, &unres):
			reason = ReasonUnresolvable
		case ctx.Err() != nil:
			reason = ReasonDeadline
		}
		return r, refuse(reason, fmt.Errorf("%s: %w", r.who, err))
	}
	return r, nil
}

// ask lists kubelet's assignments for r, once: a request asked already
// keeps its answer.
func (h *Handler) ask(ctx context.Context, r *request, pod *api.PodSandbox, ctr *api.Container) error {
	if r.kubelet != nil {
		return nil
	}
	pods, err := h.kubelet.List(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(pods, func(p podresources.Pod) bool { return p.Namespace == pod.GetNamespace() && p.Name == pod.GetName() })
	if i < 0 {
		return fmt.Errorf("kubelet's PodResources lists no pod %s/%s; check that --pod-resources-socket is this node's kubelet", pod.GetNamespace(), pod.GetName())
	}
	r.kubelet = &kubeletView{pods: pods, own: pods[i].Container(ctr.GetName())}
	return nil
}

// record is what a verdict on r records of the request: its CDI names
// and kubelet's assignment.
func (h *Handler) record(r *request) audit.Record {
	rec := audit.Record{CDI: r.names}
	if r.kubelet != nil {
		rec.Assigned = h.assignment(r.kubelet.own)
	} else {
		rec.Assigned.NotAsked = notAsked
	}
	return rec
}

// resolve resolves names as the container's user and derives the GPUs
// they stand for.
func (h *Handler) resolve(names []string, ctr *api.Container) (resolve.Result, []verify.GPU, error) {
	var res resolve.Result
	if len(names) > 0 {
		u := ctr.GetUser()
		var err error
		if res, err = h.resolver.Resolve(names, oci.User{UID: u.GetUid(), GID: u.GetGid(), AdditionalGids: u.GetAdditionalGids()}); err != nil {
			return res, nil, err
		}
	}
	gpus, err := allocated(res)
	return res, gpus, err
}

// allocated derives the GPUs from each resolved device's own edits, taking
// device node types and numbers as CDI filled them in.
func allocated(res resolve.Result) ([]verify.GPU, error) {
	filled := map[string]verify.Node{}
	if res.Spec != nil && res.Spec.Linux != nil {
		for _, d := range res.Spec.Linux.Devices {
			filled[d.Path] = verify.Node{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor}
		}
	}
	var out []verify.GPU
	for _, d := range res.Devices {
		nodes := make([]verify.Node, 0, len(d.Edits.DeviceNodes))
		for _, n := range d.Edits.DeviceNodes {
			nodes = append(nodes, filled[n.Path])
		}
		gpus, err := verify.FromEdits(d.Name, nodes, d.Edits.Env, d.Annotations)
		if err != nil {
			return nil, err
		}
		for _, g := range gpus {
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
	}
	return out, nil
}

// podLevel returns the GPU names of pod-level annotations that the
// container itself does not request.
func (h *Handler) podLevel(pod *api.PodSandbox, requested []string) []string {
	kind := h.vendor + "/" + h.class + "="
	var out []string
	for _, n := range h.collector.Pod(pod) {
		if strings.HasPrefix(n, kind) && !slices.Contains(requested, n) {
			out = append(out, n)
		}
	}
	return out
}

// kubeletUUIDs turns kubelet's device IDs into UUIDs: under
// DEVICE_ID_STRATEGY=index kubelet reports GPU indices, which the resolved
// devices' spec annotation maps to the UUIDs they inject, and MIG devices
// as "<GPU index>:<MIG index>", which a device named so or the inventory
// maps. A MIG device's index annotation is its parent's: kubelet's index
// for the parent does not mean the MIG device. An ID that maps to nothing
// is kept, so a mismatch still names it.
func (h *Handler) kubeletUUIDs(ids []string, res resolve.Result) []string {
	byIndex := map[string][]string{}
	for _, d := range res.Devices {
		_, dev, _ := strings.Cut(d.Name, "=")
		idx, ok := d.Annotations[contract.GPUIndexAnnotation]
		switch {
		case d.Annotations[contract.MIGParentAnnotation] == "" && ok:
			byIndex[idx] = deviceUUIDs(d)
		case strings.HasPrefix(dev, idx+":"):
			byIndex[dev] = deviceUUIDs(d)
		}
	}
	out := make([]string, 0, len(ids))
	for _, id := range ids {
		// A time-slicing replica "<id>::<n>" stands for its device.
		if dev, ok := sharing.DeviceOf(id); ok {
			id = dev
		}
		if us := byIndex[id]; len(us) > 0 {
			out = append(out, us...)
		} else {
			out = append(out, h.migByIndex(id))
		}
	}
	// Two replicas of one GPU are that GPU once.
	slices.Sort(out)
	return slices.Compact(out)
}

// migByIndex is the MIG device the inventory knows by kubelet's index ID
// "<GPU index>:<MIG index>"; id itself otherwise.
func (h *Handler) migByIndex(id string) string {
	inv := h.inv()
	if inv == nil || !strings.Contains(id, ":") {
		return id
	}
	for u, s := range inv.MIG {
		if id == strconv.Itoa(s.GPUIndex)+":"+strconv.Itoa(s.Index) {
			return u
		}
	}
	return id
}

// deviceUUIDs are the UUIDs (GPUs' and MIG devices') a CDI device's own
// edits name, sorted.
func deviceUUIDs(d resolve.Device) []string {
	return slices.Sorted(func(yield func(string) bool) {
		for _, m := range []map[int64]string{verify.UUIDEnv(d.Edits.Env), verify.MIGUUIDEnv(d.Edits.Env)} {
			for _, u := range m {
				if !yield(u) {
					return
				}
			}
		}
	})
}
