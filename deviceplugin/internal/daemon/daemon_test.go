package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/cdi/simulation/simtest"
	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

func simUUID(i int) string { return sim.UUID("a100-80gb", i) }

// rig is a plugin daemon on a simulated node, driven by a test kubelet.
type rig struct {
	dir     string
	kubelet *kubelettest.Kubelet
	sim     *sim.Node
	tracker atomic.Pointer[health.Tracker] // the running daemon's, once it published
	client  pluginapi.DevicePluginClient
	stop    func()
	done    chan error
	cfg     config.Config
	d       *Daemon
	// expect is each resource the daemon registers, by its socket; clients
	// are connected to each once registered.
	expect  map[string]string
	clients map[string]pluginapi.DevicePluginClient
}

// roots are the simulated driver roots, one per node shape.
var roots simtest.Roots

func driverRoot(t testing.TB, nvml string) string { return roots.Get(t, nvml) }

func TestMain(m *testing.M) { os.Exit(roots.Run(m)) }

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t testing.TB, nvml string, args ...string) *rig {
	t.Helper()
	return startExpecting(t, map[string]string{"nvidia.com/gpu": "nvinject-gpu.sock"}, nvml, args...)
}

// startExpecting starts a daemon that registers exactly the resources of
// expect, each on its socket.
func startExpecting(t testing.TB, expect map[string]string, nvml string, args ...string) *rig {
	t.Helper()
	r := newRig(t, expect, nvml, args...)
	r.run(t)
	return r
}

// newRig is startExpecting's rig before its daemon runs: its test kubelet
// and configuration (no node labels unless args ask for them).
func newRig(t testing.TB, expect map[string]string, nvml string, args ...string) *rig {
	t.Helper()
	r := &rig{dir: kubelettest.Dir(t), expect: expect}
	r.kubelet = kubelettest.Start(t, r.dir)
	base := []string{"--nvml=" + nvml, "--kubelet-dir=" + r.dir, "--cdi-spec-dir=" + filepath.Join(r.dir, "cdi"),
		"--state-dir=" + filepath.Join(r.dir, "state"),
		"--driver-root=" + driverRoot(t, nvml), "--metrics-addr=", "--health-quiet-period=0", "--pod-resources-socket=", "--node-labels=false"}
	cfg, err := config.Load(append(base, args...), func(string) string { return "" }, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r.cfg = cfg
	return r
}

// run starts a daemon for r.cfg, as a new plugin process would, and
// connects to it once it registered.
func (r *rig) run(t testing.TB, opts ...Option) {
	t.Helper()
	open := func(v string, o backend.Options) (*backend.Backend, error) {
		b, node, err := backend.OpenSimulated(v, o)
		if err == nil {
			r.sim = node
		}
		return b, err
	}
	r.tracker.Store(nil)
	published := gpunode.WithOnPublish(func(g gpunode.GPUs) { r.tracker.Store(g.Health) })
	opts = append([]Option{WithNode(gpunode.WithOpen(open), gpunode.WithNVMLRetry(10*time.Millisecond), published), WithTimings(10*time.Millisecond, 10*time.Second)}, opts...)
	d := New(r.cfg, quietLog(), opts...)
	r.d = d
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r.done = done
	go func() { done <- d.Run(ctx) }()
	r.stop = func() { cancel(); <-done }
	t.Cleanup(func() { cancel() })
	r.clients = map[string]pluginapi.DevicePluginClient{}
	for range r.expect {
		req := r.kubelet.WaitRegister(t, 10*time.Second)
		if want, ok := r.expect[req.ResourceName]; req.Version != pluginapi.Version || !ok || req.Endpoint != want || !req.GetOptions().GetGetPreferredAllocationAvailable() || r.clients[req.ResourceName] != nil {
			t.Fatalf("Register request = %v; want one per resource of %v", req, r.expect)
		}
		r.clients[req.ResourceName] = kubelettest.Dial(t, r.dir, req.Endpoint)
	}
	for res := range r.expect {
		r.client = r.clients[res]
		if res == "nvidia.com/gpu" {
			break
		}
	}
}

// watch opens ListAndWatch as kubelet does and returns a function that
// reads the next list.
func (r *rig) watch(t testing.TB) func() []*pluginapi.Device {
	t.Helper()
	return watchClient(t, r.client)
}

// watchClient is watch on one resource's service.
func watchClient(t testing.TB, client pluginapi.DevicePluginClient) func() []*pluginapi.Device {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if _, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		t.Fatal(err)
	}
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	return func() []*pluginapi.Device {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("ListAndWatch: %v", err)
		}
		return resp.Devices
	}
}

// untilHealth reads lists until the device with id has health h.
func untilHealth(t testing.TB, next func() []*pluginapi.Device, id, h string) []*pluginapi.Device {
	t.Helper()
	for {
		list := next()
		for _, d := range list {
			if d.ID == id && d.Health == h {
				return list
			}
		}
	}
}

func healthOf(list []*pluginapi.Device) map[string]string {
	m := map[string]string{}
	for _, d := range list {
		m[d.ID] = d.Health
	}
	return m
}

func TestEightGPUNodePublishesSelectedUUID(t *testing.T) {
	r := start(t, "sim:a100-80gb*8", "--visible-devices="+simUUID(5))
	next := r.watch(t)
	list := untilHealth(t, next, simUUID(5), pluginapi.Healthy)
	if len(list) != 1 || list[0].ID != simUUID(5) || list[0].Topology.GetNodes()[0].GetID() != 1 {
		t.Fatalf("published %v; want only GPU 5 on NUMA node 1", list)
	}
	spec, err := os.ReadFile(filepath.Join(r.dir, "cdi", "nvidia.com-gpu.yaml"))
	if err != nil {
		t.Fatalf("CDI spec not written before Register: %v", err)
	}
	if !strings.Contains(string(spec), "name: "+simUUID(5)) || strings.Contains(string(spec), simUUID(4)) {
		t.Fatalf("CDI spec does not hold exactly the selected GPU:\n%s", spec)
	}
}

func TestXidUpdatesListAndWatchAndIgnoredXidDoesNot(t *testing.T) {
	r := start(t, "sim:a100-80gb*2")
	next := r.watch(t)
	untilHealth(t, next, simUUID(1), pluginapi.Healthy)
	for _, x := range []uint64{13, 43} {
		if err := r.sim.InjectXid(simUUID(1), x); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.sim.InjectXid(simUUID(1), 79); err != nil {
		t.Fatal(err)
	}
	// The first list after the ignored Xids must already be the Xid 79 one:
	// ignored Xids send nothing.
	list := next()
	if h := healthOf(list); h[simUUID(1)] != pluginapi.Unhealthy || h[simUUID(0)] != pluginapi.Healthy {
		t.Fatalf("after Xid 79: %v", h)
	}
	resp, err := r.client.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{simUUID(1)}}}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), simUUID(1)) {
		t.Fatalf("Allocate of the Unhealthy GPU = %v, %v; want a refusal naming it", resp, err)
	}
	if err := r.sim.InjectXid(simUUID(0), 31); err != nil {
		t.Fatal(err)
	}
	// Operator recovery (the sim endpoint's and SIGHUP's path).
	if err := r.tracker.Load().Recover(context.Background(), simUUID(1)); err != nil {
		t.Fatal(err)
	}
	if h := healthOf(next()); h[simUUID(1)] != pluginapi.Healthy || h[simUUID(0)] != pluginapi.Healthy {
		t.Fatalf("after recovery: %v", h)
	}
}

func TestQuietPeriodRecoveryOverTheStream(t *testing.T) {
	r := start(t, "sim:a100-80gb", "--health-quiet-period=50ms")
	next := r.watch(t)
	untilHealth(t, next, simUUID(0), pluginapi.Healthy)
	if err := r.sim.InjectXid(simUUID(0), 48); err != nil {
		t.Fatal(err)
	}
	untilHealth(t, next, simUUID(0), pluginapi.Unhealthy)
	untilHealth(t, next, simUUID(0), pluginapi.Healthy)
}

func TestKubeletRestartReRegistersKeepingHealth(t *testing.T) {
	r := start(t, "sim:a100-80gb*2")
	next := r.watch(t)
	untilHealth(t, next, simUUID(0), pluginapi.Healthy)
	if err := r.sim.InjectXid(simUUID(0), 79); err != nil {
		t.Fatal(err)
	}
	untilHealth(t, next, simUUID(0), pluginapi.Unhealthy)

	for _, removeOwn := range []bool{false, true} {
		if removeOwn {
			// kubelet clears the device-plugins directory when it starts.
			if err := os.Remove(filepath.Join(r.dir, "nvinject-gpu.sock")); err != nil {
				t.Fatal(err)
			}
		}
		began := time.Now()
		r.kubelet = r.kubelet.Restart(t)
		// A bound, not a latency claim (the soak and the re-registration
		// benchmark measure that): a loaded 2-core machine can take over 1 s.
		req := r.kubelet.WaitRegister(t, 10*time.Second)
		t.Logf("re-registered (own socket removed: %v) in %s", removeOwn, time.Since(began))
		r.client = kubelettest.Dial(t, r.dir, req.Endpoint)
		h := healthOf(r.watch(t)())
		if h[simUUID(0)] != pluginapi.Unhealthy || h[simUUID(1)] != pluginapi.Healthy {
			t.Fatalf("health after kubelet restart = %v; want it kept", h)
		}
	}
	if err := r.sim.InjectXid(simUUID(1), 79); err != nil {
		t.Fatalf("health watch did not survive re-registration: %v", err)
	}
}

func TestAllocateStrategies(t *testing.T) {
	all := []string{simUUID(0), simUUID(1), simUUID(2)}
	names := func(ids ...string) []string {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[i] = "nvidia.com/gpu=" + id
		}
		return out
	}
	tests := []struct {
		strategy string
		idStrat  string
		ids      []string
		uuids    []string
		wantAnn  map[string]string
		wantCRI  bool
	}{
		{strategy: "cdi-annotations", ids: all[:1], uuids: all[:1],
			wantAnn: map[string]string{"cdi.k8s.io/nvinject.gpu_" + all[0]: strings.Join(names(all[0]), ",")}},
		{strategy: "cdi-annotations", ids: all, uuids: all,
			wantAnn: map[string]string{"cdi.k8s.io/nvinject.gpu_" + all[0]: strings.Join(names(all...), ",")}},
		{strategy: "cdi-cri", ids: all[:1], uuids: all[:1], wantCRI: true},
		{strategy: "cdi-cri", ids: all[1:], uuids: all[1:], wantCRI: true},
		{strategy: "nri", ids: all[:1], uuids: all[:1], wantAnn: map[string]string{"nvinject.io/cdi-devices": strings.Join(names(all[0]), ",")}},
		{strategy: "nri", ids: all, uuids: all, wantAnn: map[string]string{"nvinject.io/cdi-devices": strings.Join(names(all...), ",")}},
		{strategy: "cdi-annotations,cdi-cri", idStrat: "index", ids: []string{"2", "0"}, uuids: []string{all[2], all[0]}, wantCRI: true,
			wantAnn: map[string]string{"cdi.k8s.io/nvinject.gpu_2": strings.Join(names(all[2], all[0]), ",")}},
	}
	rigs := map[string]*rig{}
	parent := t
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%s/%d-gpus", tt.strategy, tt.idStrat, len(tt.ids)), func(t *testing.T) {
			key := tt.strategy + tt.idStrat
			r, ok := rigs[key]
			if !ok {
				args := []string{"--device-list-strategy=" + tt.strategy}
				if tt.idStrat != "" {
					args = append(args, "--device-id-strategy="+tt.idStrat)
				}
				r = start(parent, "sim:a100-80gb*3", args...)
				untilHealth(parent, r.watch(parent), tt.ids[0], pluginapi.Healthy)
				rigs[key] = r
			}
			resp, err := r.client.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: tt.ids}}})
			if err != nil {
				t.Fatal(err)
			}
			c := resp.ContainerResponses[0]
			if !maps.Equal(c.Annotations, tt.wantAnn) {
				t.Errorf("annotations = %v; want %v", c.Annotations, tt.wantAnn)
			}
			var cri []string
			for _, d := range c.CdiDevices {
				cri = append(cri, d.Name)
			}
			want := []string(nil)
			if tt.wantCRI {
				want = names(tt.uuids...)
			}
			if !slices.Equal(cri, want) {
				t.Errorf("CdiDevices = %v; want %v", cri, want)
			}
			if len(c.Envs)+len(c.Mounts)+len(c.Devices) != 0 {
				t.Errorf("response has env/mounts/devices: %v", c)
			}
		})
	}
}

func TestAllocateRefusesUnknownIDs(t *testing.T) {
	r := start(t, "sim:a100-80gb*8", "--visible-devices="+simUUID(2))
	untilHealth(t, r.watch(t), simUUID(2), pluginapi.Healthy)
	_, err := r.client.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{simUUID(2), simUUID(3), "GPU-bogus"}}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), simUUID(3)) || !strings.Contains(err.Error(), "GPU-bogus") {
		t.Fatalf("Allocate = %v; want InvalidArgument naming the unpublished and bogus IDs", err)
	}
}

func TestGetPreferredAllocationNeverFails(t *testing.T) {
	r := start(t, "sim:a100-80gb*8", "--device-id-strategy=index")
	resp, err := r.client.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"0", "2", "5", "4", "bad"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"1", "bad", "7", "3"}, MustIncludeDeviceIDs: []string{"bad"}, AllocationSize: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := [][]string{}
	for _, c := range resp.ContainerResponses {
		ids := slices.Clone(c.DeviceIDs)
		sort.Strings(ids)
		got = append(got, ids)
	}
	// 4 and 5 share a PCIe switch on NUMA 1; 1 and 3 share NUMA 0.
	if !slices.Equal(got[0], []string{"4", "5"}) || !slices.Equal(got[1], []string{"1", "3"}) {
		t.Fatalf("preferred = %v", got)
	}
}

func TestShutdownRemovesSocket(t *testing.T) {
	r := start(t, "sim:a100-80gb")
	next := r.watch(t)
	untilHealth(t, next, simUUID(0), pluginapi.Healthy)
	r.stop()
	if _, err := os.Stat(filepath.Join(r.dir, "nvinject-gpu.sock")); !os.IsNotExist(err) {
		t.Fatalf("plugin socket still there after shutdown: %v", err)
	}
}
