package plugin_test

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/nri/internal/collect"
	"github.com/nvinject/nvinject/nri/internal/conn"
	"github.com/nvinject/nvinject/nri/internal/metrics"
	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/simfault"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/podresources"
)

// env is one plugin connected to one in-process NRI runtime.
type env struct {
	node    nritest.Node
	rt      *nritest.Runtime
	reg     *prometheus.Registry
	runner  *conn.Runner
	handler *plugin.Handler
	// slow is the handler as the runner registers it when envOpts.slow.
	slow    *simfault.Slow
	stopped chan struct{}
}

type envOpts struct {
	hook    bool
	kubelet string
	// node is the simulated node (default sim:a100-80gb*8); inventory
	// hands the handler its inventory.
	node      string
	inventory bool
	// slow registers the handler wrapped in the simulation's delay.
	slow     bool
	pods     []*api.PodSandbox
	ctrs     []*api.Container
	extraDir func(dir string)
	// runtimeOpts configure the NRI runtime, handlerOpts the handler.
	runtimeOpts []adaptation.Option
	handlerOpts []plugin.Option
	runnerOpts  []conn.Option
}

func shortDir(t testing.TB) string {
	t.Helper()
	// Unix socket paths must stay under ~100 bytes; t.TempDir() can exceed it.
	d, err := os.MkdirTemp("", "nvnri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func start(t *testing.T, o envOpts) *env {
	t.Helper()
	node := nritest.NewNode(t, cmp.Or(o.node, "sim:a100-80gb*8"), o.hook)
	// A malformed spec beside the good one must not affect it.
	if err := os.WriteFile(filepath.Join(node.SpecDir, "broken.yaml"), []byte("cdiVersion: [not a spec\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o.extraDir != nil {
		o.extraDir(node.SpecDir)
	}
	e := &env{node: node, reg: prometheus.NewRegistry(), stopped: make(chan struct{})}
	e.rt = nritest.NewRuntime(filepath.Join(shortDir(t), "nri.sock"), o.pods, o.ctrs, o.runtimeOpts...)
	e.rt.Start(t)

	col, err := collect.New()
	if err != nil {
		t.Fatal(err)
	}
	res, err := resolve.New([]string{node.SpecDir, filepath.Join(t.TempDir(), "absent")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Close() })
	m := metrics.New(e.reg)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	opts := []plugin.Option{plugin.WithLogger(log), plugin.WithMetrics(m)}
	if o.inventory {
		opts = append(opts, plugin.WithInventory(verify.InventoryOf(node.Node)))
	}
	if o.kubelet != "" {
		pr, err := podresources.Dial(o.kubelet)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pr.Close() })
		opts = append(opts, plugin.WithKubelet(pr))
	}
	h := plugin.NewHandler(col, res, append(opts, o.handlerOpts...)...)
	e.handler = h
	var p conn.Plugin = h
	if o.slow {
		e.slow = simfault.NewSlow(h, 0)
		p = e.slow
	}
	e.runner = conn.New(p, "nvinject", "10", e.rt.Socket, append([]conn.Option{conn.WithLogger(log), conn.WithMetrics(m), conn.WithRetryInterval(50 * time.Millisecond)}, o.runnerOpts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(e.stopped)
		if err := e.runner.Run(ctx); err != nil {
			t.Errorf("runner: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-e.stopped })
	e.rt.WaitSynced(t)
	return e
}

// create runs one container through containerd's path: optional built-in
// CDI injection, NRI CreateContainer, then the adjustment applied.
func (e *env) create(t *testing.T, pod *api.PodSandbox, ann map[string]string, containerdCDI []string, cri ...string) (*oci.Spec, *api.ContainerAdjustment, error) {
	t.Helper()
	s := nritest.BaseSpec()
	if len(containerdCDI) > 0 {
		nritest.ContainerdCDI(t, s, e.node.SpecDir, containerdCDI...)
	}
	ctr := nritest.Container("ctr-"+pod.GetId(), pod.GetId(), "main", s, ann, cri...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	adj, err := e.rt.Create(ctx, pod, ctr)
	if err != nil {
		return nil, nil, err
	}
	nritest.Apply(t, s, adj)
	return s, adj, nil
}

// remove tells the plugin the container e.create made for pod is gone.
func (e *env) remove(t *testing.T, pod *api.PodSandbox) {
	t.Helper()
	ctr := &api.Container{Id: "ctr-" + pod.GetId(), PodSandboxId: pod.GetId(), Name: "main"}
	if err := e.rt.RemoveContainer(context.Background(), pod, ctr); err != nil {
		t.Fatal(err)
	}
}

func gpuMinors(s *oci.Spec) []int64 {
	var out []int64
	for _, d := range s.Linux.Devices {
		if d.Type == "c" && d.Major == 195 && d.Minor < 254 {
			out = append(out, d.Minor)
		}
	}
	slices.Sort(out)
	return out
}

func envOf(s *oci.Spec, key string) (string, bool) {
	for _, kv := range s.Process.Env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v, true
		}
	}
	return "", false
}

func allowed(s *oci.Spec, minor int64) bool {
	for _, r := range s.Linux.Resources.Devices {
		if r.Allow && r.Type == "c" && r.Major != nil && *r.Major == 195 && r.Minor != nil && *r.Minor == minor {
			return true
		}
	}
	return false
}

func TestInjectsAllocatedGPUs(t *testing.T) {
	e := start(t, envOpts{})
	n := e.node
	for i, tc := range []struct {
		name          string
		gpus          []int
		ann           func() map[string]string
		cri           []string
		containerdCDI bool
	}{
		{name: "1 GPU via nvinject annotation", gpus: []int{0},
			ann: func() map[string]string { return map[string]string{contract.DevicesAnnotation: n.Name(0)} }},
		{name: "2 GPUs via nvinject annotation", gpus: []int{2, 5},
			ann: func() map[string]string {
				return map[string]string{contract.DevicesAnnotation: n.Name(2) + "," + n.Name(5)}
			}},
		{name: "2 GPUs via cdi.k8s.io annotation, containerd CDI not configured", gpus: []int{1, 3},
			ann: func() map[string]string {
				return map[string]string{"cdi.k8s.io/nvinject.gpu_x": n.Name(1) + "," + n.Name(3)}
			}},
		{name: "1 GPU via CRI CDIDevices already applied by containerd", gpus: []int{7}, cri: []string{n.Name(7)}, containerdCDI: true,
			ann: func() map[string]string { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pre []string
			if tc.containerdCDI {
				pre = tc.cri
			}
			s, adj, err := e.create(t, nritest.Pod(fmt.Sprint("p", i), "nvidia", nil), tc.ann(), pre, tc.cri...)
			if err != nil {
				t.Fatalf("CreateContainer: %v", err)
			}
			var want []int64
			var uuids []string
			for _, g := range tc.gpus {
				d := n.Devices[g]
				want = append(want, int64(d.Minor))
				uuids = append(uuids, d.UUID)
				if v, _ := envOf(s, fmt.Sprintf("NVINJECT_GPU_UUID_%d", d.Minor)); v != d.UUID {
					t.Errorf("env NVINJECT_GPU_UUID_%d = %q, want %q", d.Minor, v, d.UUID)
				}
				if !allowed(s, int64(d.Minor)) {
					t.Errorf("no device cgroup rule allows 195:%d", d.Minor)
				}
			}
			if got := gpuMinors(s); !slices.Equal(got, want) {
				t.Errorf("GPU nodes = %v, want %v", got, want)
			}
			if v, _ := envOf(s, "NVIDIA_VISIBLE_DEVICES"); v != "void" {
				t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want void", v)
			}
			if !slices.ContainsFunc(s.Linux.Devices, func(d oci.LinuxDevice) bool { return d.Path == "/dev/nvidiactl" }) {
				t.Error("control node /dev/nvidiactl missing")
			}
			if !slices.ContainsFunc(s.Mounts, func(m oci.Mount) bool { return strings.Contains(m.Destination, "libnvidia-ml.so") }) {
				t.Error("driver library mount missing")
			}
			slices.Sort(uuids)
			if got := s.Annotations[plugin.UUIDsKey]; got != strings.Join(uuids, ",") {
				t.Errorf("annotation %s = %q, want %q", plugin.UUIDsKey, got, strings.Join(uuids, ","))
			}
			if tc.containerdCDI && (len(adj.GetLinux().GetDevices()) > 0 || len(adj.GetMounts()) > 0) {
				t.Errorf("containerd already applied the device, but the adjustment re-adds %d devices and %d mounts",
					len(adj.GetLinux().GetDevices()), len(adj.GetMounts()))
			}
		})
	}
	if got := value(t, e.reg, "nvinject_nri_injections_total", nil); got != 4 {
		t.Errorf("injections_total = %v, want 4", got)
	}
}

func TestAlreadyInjectedByContainerdIsNotDuplicated(t *testing.T) {
	e := start(t, envOpts{hook: true})
	name := e.node.Name(4)
	// containerd applied the cdi.k8s.io annotation; the nvinject annotation
	// names the same device again.
	ann := map[string]string{"cdi.k8s.io/nvinject.gpu_1": name, contract.DevicesAnnotation: name}
	s, adj, err := e.create(t, nritest.Pod("p", "nvidia", nil), ann, []string{name})
	if err != nil {
		t.Fatal(err)
	}
	if hookCount(adj.GetHooks()) > 0 || len(adj.GetMounts()) > 0 || len(adj.GetLinux().GetDevices()) > 0 || len(adj.GetEnv()) > 0 {
		t.Errorf("adjustment repeats containerd's CDI edits: %v", adj)
	}
	// The spec's hooks: create-symlinks, enable-cuda-compat, update-ldcache.
	if n := len(s.Hooks.CreateContainer); n != 3 {
		t.Errorf("createContainer hooks = %d, want exactly the spec's 3", n)
	}
	seen := map[string]bool{}
	for _, m := range s.Mounts {
		if seen[m.Destination] {
			t.Errorf("mount %s is duplicated", m.Destination)
		}
		seen[m.Destination] = true
	}
	if got := gpuMinors(s); !slices.Equal(got, []int64{int64(e.node.Devices[4].Minor)}) {
		t.Errorf("GPU nodes = %v", got)
	}

	// Without containerd's CDI the plugin adds the spec's hooks, once.
	e.remove(t, nritest.Pod("p", "nvidia", nil))
	s, adj, err = e.create(t, nritest.Pod("q", "nvidia", nil), map[string]string{contract.DevicesAnnotation: name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Hooks == nil || len(s.Hooks.CreateContainer) != 3 || slices.ContainsFunc(s.Hooks.CreateContainer, func(h oci.Hook) bool { return h.Path != e.node.Hook }) {
		t.Errorf("hooks = %+v, want the spec's 3 hooks once", s.Hooks)
	}
	if len(adj.GetMounts()) == 0 {
		t.Error("adjustment has no mounts although containerd applied nothing")
	}
}

func TestNonNvidiaPodUntouched(t *testing.T) {
	e := start(t, envOpts{})
	s, adj, err := e.create(t, nritest.Pod("p", "", nil), map[string]string{"app": "web"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if adj != nil && (len(adj.GetAnnotations()) > 0 || len(adj.GetEnv()) > 0 || len(adj.GetMounts()) > 0 || len(adj.GetLinux().GetDevices()) > 0 || hookCount(adj.GetHooks()) > 0) {
		t.Errorf("runc pod was adjusted: %v", adj)
	}
	if len(s.Linux.Devices) != 0 || len(s.Process.Env) != 1 {
		t.Errorf("spec changed: devices %v env %v", s.Linux.Devices, s.Process.Env)
	}
	// An nvidia pod without a GPU request gets nothing either.
	if _, adj, err = e.create(t, nritest.Pod("q", "nvidia", nil), nil, nil); err != nil || len(adj.GetLinux().GetDevices()) > 0 {
		t.Errorf("nvidia pod without GPUs: adj %v err %v", adj, err)
	}
}

func TestRefusals(t *testing.T) {
	e := start(t, envOpts{})
	n := e.node
	leak := func(s *oci.Spec) {
		s.Linux.Devices = append(s.Linux.Devices, oci.LinuxDevice{Path: "/dev/nvidia3", Type: "c", Major: 195, Minor: 3})
	}
	for _, tc := range []struct {
		name    string
		pod     *api.PodSandbox
		ann     map[string]string
		cri     []string
		mutate  func(*oci.Spec)
		reason  string
		wantErr []string
	}{
		{name: "GPU outside the nvidia RuntimeClass", pod: nritest.Pod("a", "", nil),
			ann: map[string]string{"cdi.k8s.io/dp": n.Name(0)}, reason: plugin.ReasonRuntimeClass,
			wantErr: []string{"runtimeClassName: nvidia", n.Name(0)}},
		{name: "nvinject annotation outside the nvidia RuntimeClass", pod: nritest.Pod("b", "runc", nil),
			ann: map[string]string{contract.DevicesAnnotation: n.Name(1)}, reason: plugin.ReasonRuntimeClass,
			wantErr: []string{"runtimeClassName: nvidia"}},
		{name: "pod-level spoofed annotation", pod: nritest.Pod("c", "nvidia", map[string]string{"cdi.k8s.io/x": n.Name(2)}),
			reason: plugin.ReasonPodLevel, wantErr: []string{"pod-level", n.Name(2)}},
		{name: "pod-level nvinject annotation", pod: nritest.Pod("d", "nvidia", map[string]string{contract.DevicesAnnotation: n.Name(2)}),
			ann: map[string]string{contract.DevicesAnnotation: n.Name(1)}, reason: plugin.ReasonPodLevel, wantErr: []string{n.Name(2)}},
		{name: "unknown CDI name", pod: nritest.Pod("e", "nvidia", nil),
			ann: map[string]string{contract.DevicesAnnotation: "nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000"}, reason: plugin.ReasonUnresolvable,
			wantErr: []string{"unresolvable", "GPU-00000000-0000-0000-0000-000000000000", n.SpecDir, "broken.yaml"}},
		{name: "malformed nvinject annotation", pod: nritest.Pod("f", "nvidia", nil),
			ann: map[string]string{contract.DevicesAnnotation: "GPU-1"}, reason: plugin.ReasonBadRequest, wantErr: []string{contract.DevicesAnnotation}},
		{name: "foreign GPU node leaked in", pod: nritest.Pod("g", "nvidia", nil), mutate: leak,
			ann: map[string]string{contract.DevicesAnnotation: n.Name(0)}, reason: "foreign-gpu",
			wantErr: []string{"/dev/nvidia3", "expected [/dev/nvidia0]", "found [/dev/nvidia0 /dev/nvidia3]"}},
		{name: "GPU node in an nvidia pod without a GPU request", pod: nritest.Pod("h", "nvidia", nil), mutate: leak,
			reason: "foreign-gpu", wantErr: []string{"/dev/nvidia3"}},
		{name: "UUID env disagrees with the node", pod: nritest.Pod("i", "nvidia", nil),
			mutate: func(s *oci.Spec) { s.Process.Env = append(s.Process.Env, "NVINJECT_GPU_UUID_6="+n.Devices[6].UUID) },
			ann:    map[string]string{contract.DevicesAnnotation: n.Name(0)}, reason: "env-mismatch", wantErr: []string{"NVINJECT_GPU_UUID_6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := refusals(t, e.reg, tc.reason)
			s := nritest.BaseSpec()
			if tc.mutate != nil {
				tc.mutate(s)
			}
			ctr := nritest.Container("c-"+tc.pod.GetId(), tc.pod.GetId(), "main", s, tc.ann, tc.cri...)
			_, err := e.rt.Create(context.Background(), tc.pod, ctr)
			if err == nil {
				t.Fatal("CreateContainer succeeded; want it refused")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if got := refusals(t, e.reg, tc.reason) - before; got != 1 {
				t.Errorf("refusals{reason=%q} grew by %v, want 1", tc.reason, got)
			}
		})
	}
}

func TestMalformedSpecBesideGoodOne(t *testing.T) {
	e := start(t, envOpts{extraDir: func(dir string) {
		// Valid YAML, invalid CDI (bad kind), and a spec defining another vendor.
		os.WriteFile(filepath.Join(dir, "badkind.json"), []byte(`{"cdiVersion":"0.6.0","kind":"nope","devices":[]}`), 0o644)
		os.WriteFile(filepath.Join(dir, "other.yaml"), []byte("cdiVersion: 0.6.0\nkind: example.com/nic\ndevices:\n- name: n0\n  containerEdits:\n    env: [NIC=0]\n"), 0o644)
	}})
	s, _, err := e.create(t, nritest.Pod("p", "nvidia", nil), map[string]string{contract.DevicesAnnotation: e.node.Name(3) + ",example.com/nic=n0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := gpuMinors(s); !slices.Equal(got, []int64{3}) {
		t.Errorf("GPU nodes = %v, want [3]", got)
	}
	if v, _ := envOf(s, "NIC"); v != "0" {
		t.Errorf("NIC env = %q; the good non-GPU spec was not applied", v)
	}
}

// kubelet is a PodResources server answering List with the pods it is
// given (namespace default), or with err, and counting the Lists.
type kubelet struct {
	podresv1.UnimplementedPodResourcesListerServer
	mu    sync.Mutex
	pods  map[string]*podresv1.PodResources
	err   error
	lists int
}

func (k *kubelet) List(context.Context, *podresv1.ListPodResourcesRequest) (*podresv1.ListPodResourcesResponse, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lists++
	res := &podresv1.ListPodResourcesResponse{}
	for _, n := range slices.Sorted(maps.Keys(k.pods)) {
		res.PodResources = append(res.PodResources, k.pods[n])
	}
	return res, k.err
}

// container returns container ctr of pod, adding both as needed.
func (k *kubelet) container(pod, ctr string) *podresv1.ContainerResources {
	if k.pods == nil {
		k.pods = map[string]*podresv1.PodResources{}
	}
	p := k.pods[pod]
	if p == nil {
		p = &podresv1.PodResources{Name: pod, Namespace: "default"}
		k.pods[pod] = p
	}
	for _, c := range p.Containers {
		if c.Name == ctr {
			return c
		}
	}
	c := &podresv1.ContainerResources{Name: ctr}
	p.Containers = append(p.Containers, c)
	return c
}

// assign gives container ctr of pod the device-plugin IDs (and a NIC).
func (k *kubelet) assign(pod, ctr string, ids ...string) {
	k.assignAs(pod, ctr, "nvidia.com/gpu", ids...)
}

// assignAs gives container ctr of pod the device-plugin IDs of resource
// (and a NIC).
func (k *kubelet) assignAs(pod, ctr, resource string, ids ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.container(pod, ctr)
	c.Devices = append(c.Devices, &podresv1.ContainerDevices{ResourceName: resource, DeviceIds: ids},
		&podresv1.ContainerDevices{ResourceName: "example.com/nic", DeviceIds: []string{"n0"}})
}

// claim gives container ctr of pod nvinject-dra's claim "gpu-<pod>" of
// the CDI device name.
func (k *kubelet) claim(pod, ctr, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.container(pod, ctr)
	c.DynamicResources = append(c.DynamicResources, &podresv1.DynamicResource{
		ClaimName: "gpu-" + pod, ClaimNamespace: "default",
		ClaimResources: []*podresv1.ClaimResource{{DriverName: contract.DRADriver, PoolName: "node", DeviceName: "gpu-1",
			CdiDevices: []*podresv1.CDIDevice{{Name: name}}}},
	})
}

// fail makes List fail with err.
func (k *kubelet) fail(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.err = err
}

// reset forgets every pod, failure and List.
func (k *kubelet) reset() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods, k.err, k.lists = nil, nil, 0
}

// listed is how many Lists were answered since the last reset.
func (k *kubelet) listed() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.lists
}

func serveKubelet(t *testing.T, k *kubelet) string {
	t.Helper()
	sock := filepath.Join(shortDir(t), "kubelet.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresv1.RegisterPodResourcesListerServer(srv, k)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return sock
}

func TestPodResources(t *testing.T) {
	k := &kubelet{}
	e := start(t, envOpts{kubelet: serveKubelet(t, k)})
	uuid1, uuid2 := e.node.Devices[1].UUID, e.node.Devices[2].UUID
	for _, tc := range []struct {
		name    string
		ids     []string
		wantErr []string // nil: admitted
	}{
		{name: "kubelet agrees", ids: []string{uuid1}},
		// DEVICE_ID_STRATEGY=index: kubelet reports GPU indices, not UUIDs.
		{name: "kubelet agrees by index", ids: []string{"1"}},
		{name: "kubelet assigned index 2", ids: []string{"2"}, wantErr: []string{"[2]"}},
		{name: "kubelet disagrees", ids: []string{uuid2}, wantErr: []string{uuid1, uuid2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k.reset()
			k.assign("pod-p", "main", tc.ids...)
			pod := nritest.Pod("p", "nvidia", nil)
			_, _, err := e.create(t, pod, map[string]string{contract.DevicesAnnotation: e.node.Name(1)}, nil)
			e.remove(t, pod)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("admitted")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}

	down := start(t, envOpts{kubelet: filepath.Join(shortDir(t), "absent.sock")})
	_, _, err := down.create(t, nritest.Pod("ok", "nvidia", nil), map[string]string{contract.DevicesAnnotation: down.node.Name(1)}, nil)
	if err == nil || !strings.Contains(err.Error(), "absent.sock") {
		t.Fatalf("kubelet unreachable: err = %v, want refusal naming the socket", err)
	}
	if got := refusals(t, down.reg, plugin.ReasonKubeletDown); got != 1 {
		t.Errorf("refusals{podresources-unavailable} = %v", got)
	}
}

func TestReconnectsAfterRuntimeRestart(t *testing.T) {
	e := start(t, envOpts{})
	// The runtime may finish syncing just before the stub's Start returns
	// and the runner marks itself registered.
	waitFor(t, func() bool { return e.runner.Ready() == nil })
	e.rt.Stop()
	waitFor(t, func() bool { return e.runner.Ready() != nil })
	e.rt.Start(t)
	e.rt.WaitSynced(t)
	waitFor(t, func() bool { return e.runner.Ready() == nil })
	s, _, err := e.create(t, nritest.Pod("p", "nvidia", nil), map[string]string{contract.DevicesAnnotation: e.node.Name(6)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := gpuMinors(s); !slices.Equal(got, []int64{6}) {
		t.Errorf("after reconnect GPU nodes = %v, want [6]", got)
	}
}

func TestSynchronizeReportsRunningGPUContainers(t *testing.T) {
	node := nritest.NewNode(t, "sim:a100-80gb*8", false)
	good := nritest.BaseSpec()
	nritest.ContainerdCDI(t, good, node.SpecDir, node.Name(0))
	bad := nritest.BaseSpec()
	nritest.ContainerdCDI(t, bad, node.SpecDir, node.Name(1), node.Name(2))
	// Its annotation claims one GPU while it holds two.
	pods := []*api.PodSandbox{nritest.Pod("g", "nvidia", nil), nritest.Pod("b", "nvidia", nil), nritest.Pod("r", "", nil)}
	ctrs := []*api.Container{
		nritest.Container("c1", "g", "main", good, map[string]string{"cdi.k8s.io/nvinject.gpu_0": node.Name(0)}),
		nritest.Container("c2", "b", "main", bad, map[string]string{"cdi.k8s.io/nvinject.gpu_1": node.Name(1)}),
		nritest.Container("c3", "r", "main", nritest.BaseSpec(), nil),
	}
	// Simulated UUIDs are deterministic, so the plugin's own node (a second
	// simulation of the same shape) resolves the same names.
	e := start(t, envOpts{pods: pods, ctrs: ctrs})
	if got := value(t, e.reg, "nvinject_nri_running_gpu_containers", map[string]string{"check": "pass"}); got != 1 {
		t.Errorf("passing GPU containers = %v, want 1", got)
	}
	if got := value(t, e.reg, "nvinject_nri_running_gpu_containers", map[string]string{"check": "fail"}); got != 1 {
		t.Errorf("failing GPU containers = %v, want 1", got)
	}
}

func hookCount(h *api.Hooks) int {
	return len(h.GetPrestart()) + len(h.GetCreateRuntime()) + len(h.GetCreateContainer()) + len(h.GetStartContainer()) + len(h.GetPoststart()) + len(h.GetPoststop())
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// value reads a metric through the registry, as Prometheus would, summing
// the series whose labels match.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := true
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					match = false
				}
			}
			if match {
				v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return v
}

func refusals(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	return value(t, reg, "nvinject_nri_refusals_total", map[string]string{"reason": reason})
}
