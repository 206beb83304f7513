package plugin

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/ledger"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
)

// holderOf is the ledger's Holder of ctr in pod holding units. kubelet's
// List does not cover every holder: it no longer lists a terminating pod
// whose container still runs, and without --pod-resources-socket nothing
// is asked; the ledger does.
func holderOf(pod *api.PodSandbox, ctr *api.Container, units []ledger.Unit) ledger.Holder {
	return ledger.Holder{PodUID: pod.GetUid(), Pod: pod.GetNamespace() + "/" + pod.GetName(), Ctr: ctr.GetName(), Units: units}
}

// units are the held units of uuids: gpus (the container's resolved
// units) name MIG devices' parents, else parentOf; shares names the shared
// claim each is held through.
func (h *Handler) units(uuids []string, gpus []verify.GPU, shares map[string]sharedClaim) []ledger.Unit {
	out := make([]ledger.Unit, 0, len(uuids))
	for _, u := range uuids {
		var parent string
		if i := slices.IndexFunc(gpus, func(g verify.GPU) bool { return g.UUID == u }); i >= 0 && gpus[i].MIG.ParentUUID != "" {
			parent = gpus[i].MIG.ParentUUID
		} else {
			parent = h.parentOf(u)
		}
		out = append(out, ledger.Unit{UUID: u, Parent: parent, Replicas: h.replicasOf(u), Claim: shares[u].uid, Share: shares[u].share != "", Admin: shares[u].admin})
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

// StopContainer releases the container's GPUs: a stopped container holds
// none.
func (h *Handler) StopContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	h.ledger.Release(ctr.GetId())
	return nil, nil
}

// RemoveContainer releases the container's GPUs (also for a container
// whose creation failed after the validation admitted it) and its request
// if no validation took it.
func (h *Handler) RemoveContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	h.ledger.Release(ctr.GetId())
	h.requests.drop(ctr.GetId())
	return nil
}

// RemovePodSandbox releases every GPU of the pod's containers and their
// requests.
func (h *Handler) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	h.ledger.ReleasePod(holderOf(pod, nil, nil))
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
func (h *Handler) heldInKubelet(kv *kubeletView, pod *api.PodSandbox, units []ledger.Unit, res resolve.Result) error {
	clash := func(theirs ledger.Unit, who, via string) error {
		if i := slices.IndexFunc(units, theirs.Clashes); i >= 0 {
			return h.heldError(units[i], theirs, who, via)
		}
		return nil
	}
	sharers := map[string][]ledger.Unit{}
	for _, p := range kv.pods {
		if p.Namespace == pod.GetNamespace() && p.Name == pod.GetName() {
			continue
		}
		for _, c := range p.Containers {
			who := "container " + c.Name + " of pod " + p.Namespace + "/" + p.Name
			for _, u := range h.kubeletUUIDs(h.ownIDs(c), res) {
				theirs := ledger.Unit{UUID: u, Parent: h.parentOf(u), Replicas: h.replicasOf(u)}
				sharers[p.Namespace+"/"+p.Name] = append(sharers[p.Namespace+"/"+p.Name], theirs)
				if err := clash(theirs, who, "through the device plugin ("+h.resource+")"); err != nil {
					return err
				}
			}
			for _, cl := range h.ownClaims(c) {
				shared := h.theirShares(cl.CDIDevices())
				for _, n := range cl.CDIDevices() {
					d, ok := h.resolver.Device(n)
					if !ok || !contract.IsKind(n, h.vendor, h.class) {
						continue
					}
					for _, u := range deviceUUIDs(d) {
						theirs := ledger.Unit{UUID: u, Parent: cmp.Or(d.Annotations[contract.MIGParentAnnotation], h.parentOf(u)), Claim: shared[u].uid, Share: shared[u].share != "", Admin: shared[u].admin}
						if err := clash(theirs, who, "through DRA "+cl.String()); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	if u, who, over := ledger.OverShared(units, sharers); over {
		return h.heldError(u, u, "pods "+strings.Join(who, ", "), "(kubelet's PodResources)")
	}
	return nil
}

// heldError says what of mine who holds (theirs), through what, and what
// to do.
func (h *Handler) heldError(mine, theirs ledger.Unit, who, via string) error {
	if mine.Shared() && mine.UUID == theirs.UUID {
		return fmt.Errorf("%s is shared by time-slicing with %d replicas, and all are in use by %s %s; a shared GPU serves at most its replicas' pods: delete one of them, or raise replicas in the sharing configuration", h.name(mine), mine.Replicas, who, via)
	}
	held := h.name(mine)
	switch {
	case mine.UUID == theirs.UUID:
	case mine.Parent == theirs.UUID:
		held += " is on GPU " + theirs.UUID + ", which"
	default:
		held = "GPU " + mine.UUID + " has " + h.name(theirs) + ", which"
	}
	if mine.Share != theirs.Share && mine.UUID == theirs.UUID {
		how := "whole"
		if theirs.Share {
			how = "in shares"
		}
		return fmt.Errorf("%s is held %s by %s %s; a GPU is given whole or in shares, never both: delete that pod", held, how, who, via)
	}
	if mine.Claim != "" {
		return fmt.Errorf("%s is held by %s %s, not through shared claim %s; a shared claim's GPU serves only the pods of that claim: delete that pod, or reference the same ResourceClaim", held, who, via, mine.Claim)
	}
	return fmt.Errorf("%s is held by %s %s; a GPU serves one pod, whole or each of its MIG devices one pod: delete that pod, or drain the node before moving it between the device plugin and DRA", held, who, via)
}

// name names a unit for refusals: "GPU GPU-…", or the MIG device as the
// inventory knows it ("MIG 1g.10gb MIG-… (GPU 1 GI 3 CI 0)").
func (h *Handler) name(u ledger.Unit) string {
	if u.Parent == "" && !strings.HasPrefix(u.UUID, "MIG-") {
		return "GPU " + u.UUID
	}
	if inv := h.inv(); inv != nil {
		if s, ok := inv.MIG[u.UUID]; ok {
			return s.String()
		}
	}
	return "MIG device " + u.UUID
}
