package plugin

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
)

// holder is a GPU container nvinject-nri admitted that the runtime has not
// stopped. kubelet's List does not cover them all: it no longer lists a
// terminating pod whose container still runs, and without
// --pod-resources-socket nothing is asked.
type holder struct {
	podUID, pod, ctr string // pod is namespace/name
	units            []unit
}

func holderOf(pod *api.PodSandbox, ctr *api.Container, units []unit) holder {
	return holder{podUID: pod.GetUid(), pod: pod.GetNamespace() + "/" + pod.GetName(), ctr: ctr.GetName(), units: units}
}

// unit is a GPU or MIG device a container holds; parent is a MIG device's
// GPU ("" for a whole GPU, or a MIG device whose parent is not known);
// replicas is how many pods may share it (time-slicing; 0 or 1: one);
// claim is the UID of the shared claim it is held through ("" for none);
// share marks a GPU held through a claim's GPU share, admin one held
// through a claim with admin access (a monitor).
type unit struct {
	uuid, parent string
	replicas     int
	claim        string
	share, admin bool
}

// clashes reports whether u and o cannot serve two pods: the same GPU or
// MIG device, or a whole GPU and a MIG device on it. MIG devices of one
// GPU can; a shared device can serve up to its replicas (shares); the
// pods of one shared claim share its devices; the pods of GPU shares share
// their GPU (the scheduler keeps the shares within its capacity), never
// with a pod holding it whole. A claim with admin access (which the API
// server allows only in namespaces labeled for it) watches GPUs others hold.
func (u unit) clashes(o unit) bool {
	if (u.claim != "" && u.claim == o.claim) || (u.share && o.share) || u.admin || o.admin {
		return false
	}
	return (u.uuid == o.uuid && !u.shared()) || (u.parent != "" && u.parent == o.uuid) || (o.parent != "" && o.parent == u.uuid)
}

func (u unit) shared() bool { return u.replicas > 1 }

// overShared finds a shared unit of mine that pods, each holding units,
// already hold up to its replicas, and who they are.
func overShared(mine []unit, pods map[string][]unit) (unit, []string, bool) {
	for _, u := range mine {
		if !u.shared() || u.admin {
			continue
		}
		var who []string
		for pod, us := range pods {
			if slices.ContainsFunc(us, func(o unit) bool { return o.uuid == u.uuid && !o.admin }) {
				who = append(who, pod)
			}
		}
		if len(who) >= u.replicas {
			slices.Sort(who)
			return u, who, true
		}
	}
	return unit{}, nil, false
}

// units are the held units of uuids: gpus (the container's resolved
// units) name MIG devices' parents, else parentOf; shares names the shared
// claim each is held through.
func (h *Handler) units(uuids []string, gpus []verify.GPU, shares map[string]sharedClaim) []unit {
	out := make([]unit, 0, len(uuids))
	for _, u := range uuids {
		var parent string
		if i := slices.IndexFunc(gpus, func(g verify.GPU) bool { return g.UUID == u }); i >= 0 && gpus[i].MIG.ParentUUID != "" {
			parent = gpus[i].MIG.ParentUUID
		} else {
			parent = h.parentOf(u)
		}
		out = append(out, unit{uuid: u, parent: parent, replicas: h.replicasOf(u), claim: shares[u].uid, share: shares[u].share != "", admin: shares[u].admin})
	}
	return out
}

// replicasOf is how many pods may share uuid: its CDI device's
// nvinject.io/shared-replicas, written by the device plugin from its
// time-slicing configuration; 1 when absent or unreadable.
func (h *Handler) replicasOf(uuid string) int {
	d, ok := h.resolver.Device(contract.CDIKind(h.vendor, h.class) + "=" + uuid)
	if !ok {
		return 1
	}
	n, err := strconv.Atoi(d.Annotations[contract.SharedReplicasAnnotation])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// parentOf is the GPU of MIG device uuid, from the inventory or its CDI
// device's annotation; "" for a whole GPU or when neither knows.
func (h *Handler) parentOf(uuid string) string {
	if !strings.HasPrefix(uuid, "MIG-") {
		return ""
	}
	if inv := h.inv(); inv != nil {
		if s, ok := inv.MIG[uuid]; ok {
			return s.ParentUUID
		}
	}
	if d, ok := h.resolver.Device(contract.CDIKind(h.vendor, h.class) + "=" + uuid); ok {
		return d.Annotations[contract.MIGParentAnnotation]
	}
	return ""
}

// samePod: containers of one pod may share its GPU (kubelet's business).
func (h holder) samePod(o holder) bool { return h.podUID == o.podUID && h.pod == o.pod }

// holders records the running GPU containers by container ID.
type holders struct {
	mu    sync.Mutex
	byCtr map[string]holder
}

// admit records container id as holding h.units unless a container of
// another pod holds one that clashes: then it returns that container and
// the two units. Checking and recording under one lock keeps two pods
// created at once from both getting the GPU.
func (r *holders) admit(id string, h holder) (holder, unit, unit, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pods := map[string][]unit{}
	// In container ID order: a refusal names the same holder every time.
	for _, cid := range slices.Sorted(maps.Keys(r.byCtr)) {
		o := r.byCtr[cid]
		if o.samePod(h) {
			continue
		}
		pods[o.pod] = append(pods[o.pod], o.units...)
		for _, u := range h.units {
			if i := slices.IndexFunc(o.units, u.clashes); i >= 0 {
				return o, u, o.units[i], true
			}
		}
	}
	if u, who, over := overShared(h.units, pods); over {
		// No one container: the pods that hold every replica.
		return holder{pod: strings.Join(who, ", ")}, u, u, true
	}
	if r.byCtr == nil {
		r.byCtr = map[string]holder{}
	}
	r.byCtr[id] = h
	return holder{}, unit{}, unit{}, false
}

// beside names the pods other than h's that hold a GPU or MIG device that
// h holds with admin access (or its parent or MIG devices), sorted: whom a
// monitor watches.
func (r *holders) beside(h holder) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, o := range r.byCtr {
		if o.samePod(h) || slices.Contains(out, o.pod) {
			continue
		}
		if slices.ContainsFunc(h.units, func(u unit) bool {
			return u.admin && slices.ContainsFunc(o.units, func(ou unit) bool { return !ou.admin && unit{uuid: u.uuid, parent: u.parent}.clashes(ou) })
		}) {
			out = append(out, o.pod)
		}
	}
	slices.Sort(out)
	return out
}

func (r *holders) release(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byCtr, id)
}

func (r *holders) releasePod(pod holder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, h := range r.byCtr {
		if h.samePod(pod) {
			delete(r.byCtr, id)
		}
	}
}

// reset replaces the record with what the runtime reports running.
func (r *holders) reset(byCtr map[string]holder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byCtr = byCtr
}

// StopContainer releases the container's GPUs: a stopped container holds
// none.
func (h *Handler) StopContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	h.holders.release(ctr.GetId())
	return nil, nil
}

// RemoveContainer releases the container's GPUs (also for a container
// whose creation failed after the validation admitted it) and its request
// if no validation took it.
func (h *Handler) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	h.holders.release(ctr.GetId())
	h.requests.drop(ctr.GetId())
	return nil
}

// RemovePodSandbox releases every GPU of the pod's containers and their
// requests.
func (h *Handler) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	h.holders.releasePod(holderOf(pod, nil, nil))
	h.requests.dropPod(pod)
	return nil
}

// recordedUUIDs are the UUIDs a running container was admitted with (its
// annotation) and those its CDI names resolve to now.
func recordedUUIDs(ctr *api.Container, checked []string) []string {
	out := slices.Clone(checked)
	if a := ctr.GetAnnotations()[UUIDsKey]; a != "" {
		out = append(out, strings.Split(a, ",")...)
	}
	return slices.Compact(slices.Sorted(slices.Values(out)))
}

// heldInKubelet refuses units that clash with what kubelet assigned a
// container of another pod: by a device-plugin ID (a UUID, or an index
// that the resolved devices' annotations or the inventory map) or by a
// DRA claim's CDI device (the UUIDs its edits name).
func (h *Handler) heldInKubelet(kv *kubeletView, pod *api.PodSandbox, units []unit, res resolve.Result) error {
	clash := func(theirs unit, who, via string) error {
		if i := slices.IndexFunc(units, theirs.clashes); i >= 0 {
			return h.heldError(units[i], theirs, who, via)
		}
		return nil
	}
	sharers := map[string][]unit{}
	for _, p := range kv.pods {
		if p.Namespace == pod.GetNamespace() && p.Name == pod.GetName() {
			continue
		}
		for _, c := range p.Containers {
			who := "container " + c.Name + " of pod " + p.Namespace + "/" + p.Name
			for _, u := range h.kubeletUUIDs(c.DeviceIDs, res) {
				theirs := unit{uuid: u, parent: h.parentOf(u), replicas: h.replicasOf(u)}
				sharers[p.Namespace+"/"+p.Name] = append(sharers[p.Namespace+"/"+p.Name], theirs)
				if err := clash(theirs, who, "through the device plugin ("+h.resource+")"); err != nil {
					return err
				}
			}
			for _, cl := range c.Claims {
				shared := h.theirShares(cl.CDIDevices())
				for _, n := range cl.CDIDevices() {
					d, ok := h.resolver.Device(n)
					if !ok || !contract.IsKind(n, h.vendor, h.class) {
						continue
					}
					for _, u := range deviceUUIDs(d) {
						theirs := unit{uuid: u, parent: cmp.Or(d.Annotations[contract.MIGParentAnnotation], h.parentOf(u)), claim: shared[u].uid, share: shared[u].share != "", admin: shared[u].admin}
						if err := clash(theirs, who, "through DRA "+cl.String()); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	if u, who, over := overShared(units, sharers); over {
		return h.heldError(u, u, "pods "+strings.Join(who, ", "), "(kubelet's PodResources)")
	}
	return nil
}

// heldError says what of mine who holds (theirs), through what, and what
// to do.
func (h *Handler) heldError(mine, theirs unit, who, via string) error {
	if mine.shared() && mine.uuid == theirs.uuid {
		return fmt.Errorf("%s is shared by time-slicing with %d replicas, and all are in use by %s %s; a shared GPU serves at most its replicas' pods: delete one of them, or raise replicas in the sharing configuration", h.name(mine), mine.replicas, who, via)
	}
	held := h.name(mine)
	switch {
	case mine.uuid == theirs.uuid:
	case mine.parent == theirs.uuid:
		held += " is on GPU " + theirs.uuid + ", which"
	default:
		held = "GPU " + mine.uuid + " has " + h.name(theirs) + ", which"
	}
	if mine.share != theirs.share && mine.uuid == theirs.uuid {
		how := "whole"
		if theirs.share {
			how = "in shares"
		}
		return fmt.Errorf("%s is held %s by %s %s; a GPU is given whole or in shares, never both: delete that pod", held, how, who, via)
	}
	if mine.claim != "" {
		return fmt.Errorf("%s is held by %s %s, not through shared claim %s; a shared claim's GPU serves only the pods of that claim: delete that pod, or reference the same ResourceClaim", held, who, via, mine.claim)
	}
	return fmt.Errorf("%s is held by %s %s; a GPU serves one pod, whole or each of its MIG devices one pod: delete that pod, or drain the node before moving it between the device plugin and DRA", held, who, via)
}

// name names a unit for refusals: "GPU GPU-…", or the MIG device as the
// inventory knows it ("MIG 1g.10gb MIG-… (GPU 1 GI 3 CI 0)").
func (h *Handler) name(u unit) string {
	if u.parent == "" && !strings.HasPrefix(u.uuid, "MIG-") {
		return "GPU " + u.uuid
	}
	if inv := h.inv(); inv != nil {
		if s, ok := inv.MIG[u.uuid]; ok {
			return s.String()
		}
	}
	return "MIG device " + u.uuid
}
