package plugin_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/shared/contract"
)

// wantRefused checks err is a refusal that names every want, and that it
// was counted once under reason.
func wantRefused(t *testing.T, e *env, err error, before float64, reason string, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatal("admitted; want refused")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q does not name %q", err, w)
		}
	}
	if got := refusals(t, e.reg, reason) - before; got != 1 {
		t.Errorf("refusals{reason=%q} grew by %v, want 1", reason, got)
	}
}

// A GPU that kubelet lists for another pod, through the other path (a
// node moved between the device plugin and DRA without a drain, or running
// both), is refused, naming that pod and what it holds the GPU through.
func TestHeldByAnotherPodInKubelet(t *testing.T) {
	k := &kubelet{}
	e := start(t, envOpts{kubelet: serveKubelet(t, k)})
	n := e.node
	uuid1, name1 := n.Devices[1].UUID, n.Name(1)
	index1 := strconv.Itoa(n.Devices[1].Index)
	dp := func(ids ...string) func() { return func() { k.assign("pod-c", "main", ids...) } }
	dra := func() { k.claim("pod-c", "main", name1) }
	for _, tc := range []struct {
		name string
		// own is kubelet's assignment of the container checked (pod-c),
		// others are the other pods'.
		own, others func()
		// dra: the container is injected by containerd from a claim and
		// names no CDI device itself.
		dra  bool
		want []string // nil: admitted
	}{
		{name: "device-plugin container, another pod's DRA claim holds the GPU", own: dp(uuid1),
			others: func() { k.claim("pod-other", "main", name1) },
			want:   []string{uuid1, "container main of pod default/pod-other", "DRA ResourceClaim default/gpu-pod-other", "drain the node"}},
		{name: "DRA container, another pod's device-plugin ID holds the GPU", own: dra, dra: true,
			others: func() { k.assign("pod-other", "main", uuid1) },
			want:   []string{uuid1, "container main of pod default/pod-other", "device plugin (nvidia.com/gpu)", "delete that pod"}},
		{name: "DRA container, another pod's device-plugin index holds the GPU", own: dra, dra: true,
			others: func() { k.assign("pod-other", "main", index1) },
			want:   []string{uuid1, "pod default/pod-other", "device plugin"}},
		{name: "device-plugin index container, another pod's DRA claim holds the GPU", own: dp(index1),
			others: func() { k.claim("pod-other", "main", name1) },
			want:   []string{uuid1, "pod default/pod-other", "ResourceClaim default/gpu-pod-other"}},
		{name: "other pods hold other GPUs", own: dp(uuid1),
			others: func() { k.claim("pod-other", "main", n.Name(2)); k.assign("pod-third", "main", n.Devices[3].UUID, "4") }},
		{name: "another container of the same pod holds the GPU", own: dp(uuid1),
			others: func() { k.assign("pod-c", "init", uuid1); k.claim("pod-c", "side", name1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k.reset()
			tc.own()
			tc.others()
			before := refusals(t, e.reg, plugin.ReasonHeld)
			pod := nritest.Pod("c", "nvidia", nil)
			err := e.createOne(t, pod, name1, tc.dra)
			e.remove(t, pod)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantRefused(t, e, err, before, plugin.ReasonHeld, tc.want...)
		})
	}
}

// A GPU container nvinject-nri admitted holds its GPU for as long as it
// runs, also where kubelet lists nothing for it (a terminating pod, no
// --pod-resources-socket).
func TestHeldByRunningContainer(t *testing.T) {
	e := start(t, envOpts{})
	ann := map[string]string{contract.DevicesAnnotation: e.node.Name(2)}
	if _, _, err := e.create(t, nritest.Pod("a", "nvidia", nil), ann, nil); err != nil {
		t.Fatal(err)
	}
	before := refusals(t, e.reg, plugin.ReasonHeld)
	_, _, err := e.create(t, nritest.Pod("b", "nvidia", nil), map[string]string{contract.DevicesAnnotation: e.node.Name(3) + "," + e.node.Name(2)}, nil)
	wantRefused(t, e, err, before, plugin.ReasonHeld,
		e.node.Devices[2].UUID, "container main of pod default/pod-a", "as a running container seen by nvinject-nri", "delete that pod")
	// The refused container holds nothing: its other GPU stays free.
	if _, _, err := e.create(t, nritest.Pod("c", "nvidia", nil), map[string]string{contract.DevicesAnnotation: e.node.Name(3)}, nil); err != nil {
		t.Fatalf("GPU 3 of the refused container is held: %v", err)
	}
}

// A restarted nvinject-nri rebuilds its record from the containers the
// runtime reports in Synchronize; stopped ones hold nothing. A later
// Synchronize (the runtime restarted) replaces the record.
func TestHeldRebuiltFromSynchronize(t *testing.T) {
	node := nritest.NewNode(t, "sim:a100-80gb*8", false)
	spec := func(names ...string) *api.Container {
		s := nritest.BaseSpec()
		nritest.ContainerdCDI(t, s, node.SpecDir, names...)
		return nritest.Container("", "", "main", s, nil)
	}
	ctr := func(id, pod string, state api.ContainerState, c *api.Container, ann map[string]string) *api.Container {
		c.Id, c.PodSandboxId, c.State, c.Annotations = id, pod, state, ann
		return c
	}
	pods := []*api.PodSandbox{nritest.Pod("dra", "nvidia", nil), nritest.Pod("dp", "nvidia", nil), nritest.Pod("done", "nvidia", nil)}
	ctrs := []*api.Container{
		// A DRA container names no CDI device; the annotation nvinject-nri
		// set when it admitted it records its GPU.
		ctr("c-dra", "dra", api.ContainerState_CONTAINER_RUNNING, spec(node.Name(0)), map[string]string{plugin.UUIDsKey: node.Devices[0].UUID}),
		ctr("c-dp", "dp", api.ContainerState_CONTAINER_RUNNING, spec(node.Name(2)), map[string]string{"cdi.k8s.io/nvinject.gpu_2": node.Name(2)}),
		ctr("c-done", "done", api.ContainerState_CONTAINER_STOPPED, spec(node.Name(1)), map[string]string{plugin.UUIDsKey: node.Devices[1].UUID}),
	}
	e := start(t, envOpts{pods: pods, ctrs: ctrs})
	try := func(id string, gpu int) error {
		_, _, err := e.create(t, nritest.Pod(id, "nvidia", nil), map[string]string{contract.DevicesAnnotation: e.node.Name(gpu)}, nil)
		return err
	}
	before := refusals(t, e.reg, plugin.ReasonHeld)
	wantRefused(t, e, try("new0", 0), before, plugin.ReasonHeld, "container main of pod default/pod-dra", "running container seen by nvinject-nri")
	wantRefused(t, e, try("new2", 2), before+1, plugin.ReasonHeld, "container main of pod default/pod-dp")
	if err := try("new1", 1); err != nil {
		t.Fatalf("GPU of a stopped container is held: %v", err)
	}

	// The runtime restarts with the DRA pod gone, the DP pod still running.
	e.rt.SetRunning(pods[1:2], ctrs[1:2])
	e.rt.Stop()
	e.rt.Start(t)
	e.rt.WaitSynced(t)
	waitFor(t, func() bool { return e.runner.Ready() == nil })
	if err := try("again0", 0); err != nil {
		t.Fatalf("GPU of a container gone while disconnected is still held: %v", err)
	}
	wantRefused(t, e, try("again2", 2), before+2, plugin.ReasonHeld, "container main of pod default/pod-dp")
}

// Stopping or removing the container, or removing its pod, frees its GPU
// for the next pod.
func TestHeldReleased(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release func(rt *nritest.Runtime, pod *api.PodSandbox, ctr *api.Container) error
	}{
		{"StopContainer", func(rt *nritest.Runtime, pod *api.PodSandbox, ctr *api.Container) error {
			return rt.StopContainer(context.Background(), pod, ctr)
		}},
		{"RemoveContainer", func(rt *nritest.Runtime, pod *api.PodSandbox, ctr *api.Container) error {
			return rt.RemoveContainer(context.Background(), pod, ctr)
		}},
		{"RemovePodSandbox", func(rt *nritest.Runtime, pod *api.PodSandbox, _ *api.Container) error {
			return rt.RemovePodSandbox(context.Background(), pod)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, envOpts{})
			ann := map[string]string{contract.DevicesAnnotation: e.node.Name(3)}
			a := nritest.Pod("a", "nvidia", nil)
			if _, _, err := e.create(t, a, ann, nil); err != nil {
				t.Fatal(err)
			}
			b := nritest.Pod("b", "nvidia", nil)
			if _, _, err := e.create(t, b, ann, nil); err == nil {
				t.Fatal("pod b got pod a's running GPU")
			}
			if err := tc.release(e.rt, a, &api.Container{Id: "ctr-a", PodSandboxId: "a", Name: "main"}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := e.create(t, b, ann, nil); err != nil {
				t.Fatalf("after %s of pod a's container, pod b refused: %v", tc.name, err)
			}
		})
	}
}

// Containers of one pod may share its GPU (an init container, then the
// main one): that is kubelet's business.
func TestSamePodSharesGPU(t *testing.T) {
	k := &kubelet{}
	e := start(t, envOpts{kubelet: serveKubelet(t, k)})
	uuid6 := e.node.Devices[6].UUID
	k.assign("pod-a", "init", uuid6)
	k.assign("pod-a", "main", uuid6)
	pod := nritest.Pod("a", "nvidia", nil)
	ann := map[string]string{contract.DevicesAnnotation: e.node.Name(6)}
	for _, name := range []string{"init", "main"} {
		ctr := nritest.Container(name+"-a", "a", name, nritest.BaseSpec(), ann)
		if _, err := e.rt.Create(context.Background(), pod, ctr); err != nil {
			t.Fatalf("container %s of the pod holding the GPU refused: %v", name, err)
		}
	}
	// The record alone still tells another pod apart.
	other := nritest.Pod("a", "nvidia", nil)
	other.Uid = "uid-of-a-new-pod-a"
	k.reset()
	k.assign("pod-a", "main", uuid6)
	before := refusals(t, e.reg, plugin.ReasonHeld)
	_, err := e.rt.Create(context.Background(), other, nritest.Container("main-a2", "a", "main", nritest.BaseSpec(), ann))
	wantRefused(t, e, err, before, plugin.ReasonHeld, "of pod default/pod-a", "running container seen by nvinject-nri")
}

// Fail closed: a GPU container is refused when kubelet's List cannot be
// answered, or does not list its pod.
func TestPodResourcesListFails(t *testing.T) {
	k := &kubelet{}
	e := start(t, envOpts{kubelet: serveKubelet(t, k)})
	name1 := e.node.Name(1)
	for _, tc := range []struct {
		name  string
		setup func()
		dra   bool
		want  string
	}{
		{"List fails, device-plugin container", func() { k.assign("pod-c", "main", e.node.Devices[1].UUID); k.fail(errors.New("kubelet is restarting")) }, false, "kubelet is restarting"},
		{"List fails, DRA container", func() { k.claim("pod-c", "main", name1); k.fail(errors.New("kubelet is restarting")) }, true, "kubelet is restarting"},
		{"pod not listed", func() { k.assign("pod-other", "main", e.node.Devices[1].UUID) }, false, "lists no pod default/pod-c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k.reset()
			tc.setup()
			before := refusals(t, e.reg, plugin.ReasonKubeletDown)
			pod := nritest.Pod("c", "nvidia", nil)
			err := e.createOne(t, pod, name1, tc.dra)
			e.remove(t, pod)
			wantRefused(t, e, err, before, plugin.ReasonKubeletDown, tc.want, "--pod-resources-socket")
		})
	}
}

// Outside the served runtime handlers a container with the host's NVIDIA
// nodes (a privileged system pod on a GPU host) is admitted when kubelet's
// PodResources fails: the claims would only name a refusal there.
func TestPodResourcesFailsOutsideRuntimeClass(t *testing.T) {
	k := &kubelet{}
	e := start(t, envOpts{kubelet: serveKubelet(t, k)})
	k.fail(errors.New("kubelet is restarting"))
	pod := nritest.Pod("priv", "", nil)
	if _, _, err := e.create(t, pod, nil, []string{e.node.Name(1)}); err != nil {
		t.Fatalf("privileged-style container outside RuntimeClass nvidia refused while PodResources fails: %v", err)
	}
	e.remove(t, pod)
}

// createOne creates pod's GPU container asking for the CDI device name: as
// a DRA container (containerd applied the name itself) or through the
// device plugin's annotation.
func (e *env) createOne(t *testing.T, pod *api.PodSandbox, name string, dra bool) error {
	t.Helper()
	var err error
	if dra {
		_, _, err = e.create(t, pod, nil, []string{name})
	} else {
		_, _, err = e.create(t, pod, map[string]string{contract.DevicesAnnotation: name}, nil)
	}
	return err
}
