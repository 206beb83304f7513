package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/shared/contract"
)

// holder is a GPU container nvinject-nri admitted that the runtime has not
// stopped. kubelet's List does not cover them all: it no longer lists a
// terminating pod whose container still runs, and without
// --pod-resources-socket nothing is asked.
type holder struct {
	podUID, pod, ctr string // pod is namespace/name
	uuids            []string
}

func holderOf(pod *api.PodSandbox, ctr *api.Container, uuids []string) holder {
	return holder{podUID: pod.GetUid(), pod: pod.GetNamespace() + "/" + pod.GetName(), ctr: ctr.GetName(), uuids: uuids}
}

// samePod: containers of one pod may share its GPU (kubelet's business).
func (h holder) samePod(o holder) bool { return h.podUID == o.podUID && h.pod == o.pod }

// holders records the running GPU containers by container ID.
type holders struct {
	mu    sync.Mutex
	byCtr map[string]holder
}

// admit records container id as holding h.uuids unless a container of
// another pod holds one of them: then it returns that container and UUID.
// Checking and recording under one lock keeps two pods created at once
// from both getting the GPU.
func (r *holders) admit(id string, h holder) (holder, string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range r.byCtr {
		if o.samePod(h) {
			continue
		}
		for _, u := range h.uuids {
			if slices.Contains(o.uuids, u) {
				return o, u, true
			}
		}
	}
	if r.byCtr == nil {
		r.byCtr = map[string]holder{}
	}
	r.byCtr[id] = h
	return holder{}, "", false
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

// heldInKubelet refuses uuids that kubelet assigned a container of another
// pod: by a device-plugin ID (a UUID, or an index that the resolved
// devices' index annotation maps) or by a DRA claim's CDI device (the UUID
// its edits name).
func (h *Handler) heldInKubelet(kv *kubeletView, pod *api.PodSandbox, uuids []string, res resolve.Result) error {
	for _, p := range kv.pods {
		if p.Namespace == pod.GetNamespace() && p.Name == pod.GetName() {
			continue
		}
		for _, c := range p.Containers {
			who := "container " + c.Name + " of pod " + p.Namespace + "/" + p.Name
			for _, u := range kubeletUUIDs(c.DeviceIDs, res) {
				if slices.Contains(uuids, u) {
					return heldError(u, who, "through the device plugin ("+h.resource+")")
				}
			}
			for _, cl := range c.Claims {
				for _, n := range cl.CDIDevices() {
					d, ok := h.resolver.Device(n)
					if !ok || !contract.IsKind(n, h.vendor, h.class) {
						continue
					}
					for _, u := range deviceUUIDs(d) {
						if slices.Contains(uuids, u) {
							return heldError(u, who, "through DRA "+cl.String())
						}
					}
				}
			}
		}
	}
	return nil
}

// heldError says who holds the GPU, through what, and what to do.
func heldError(uuid, who, via string) error {
	return fmt.Errorf("GPU %s is held by %s %s; one GPU serves one pod: delete that pod, or drain the node before moving it between the device plugin and DRA", uuid, who, via)
}
