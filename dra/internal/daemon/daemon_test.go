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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/cdi/simulation/simtest"
	"github.com/nvinject/nvinject/dra/internal/config"
	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/gpunode/nodemove/nodemovetest"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

const nodeName = "node-a"

// roots are the simulated driver roots, one per node shape.
var roots simtest.Roots

func driverRoot(t testing.TB, nvml string) string { return roots.Get(t, nvml) }

func TestMain(m *testing.M) { os.Exit(roots.Run(m)) }

// rig is nvinject-dra on a simulated node, with a fake API server and this
// test playing kubelet over the real unix sockets.
type rig struct {
	dir string
	// holds receives the kubelet dir and resource of each endpoint held.
	holds  chan [2]string
	client *fake.Clientset
	cfg    config.Config
	sim    *sim.Node
	// tracker is the running daemon's health tracker, once it published.
	tracker atomic.Pointer[health.Tracker]
	d       *Daemon
	stop    func()
	done    chan error
}

func newRig(t testing.TB, nvml string, extra ...string) *rig {
	t.Helper()
	dir, err := os.MkdirTemp("", "nvdra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, sub := range []string{"registry"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := &rig{dir: dir, holds: make(chan [2]string, 4), client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid"}})}
	// The API server names generateName objects; the fake does not, and a
	// MIG node's pool is two slices (counter sets, devices).
	var named atomic.Int64
	r.client.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(k8stesting.CreateAction).GetObject().(metav1.Object); ok && o.GetName() == "" && o.GetGenerateName() != "" {
			o.SetName(fmt.Sprintf("%s%d", o.GetGenerateName(), named.Add(1)))
		}
		return false, nil, nil
	})
	r.cfg, err = config.Load(append([]string{"--nvml=" + nvml, "--node-name=" + nodeName, "--driver-root=" + driverRoot(t, nvml),
		"--cdi-spec-dir=" + filepath.Join(dir, "cdi"), "--kubelet-registrar-dir=" + filepath.Join(dir, "registry"),
		"--kubelet-plugins-dir=" + filepath.Join(dir, "plugins"), "--kubelet-dir=" + filepath.Join(dir, "dp"), "--pod-resources-socket=", "--metrics-addr=", "--health-quiet-period=0"}, extra...),
		func(string) string { return "" }, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r.start(t)
	return r
}

func (r *rig) start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	startOnce := sync.OnceFunc(func() { close(started) })
	open := func(v string, o backend.Options) (*backend.Backend, error) {
		b, node, err := backend.OpenSimulated(v, o)
		if err == nil {
			r.sim = node
		}
		return b, err
	}
	r.tracker.Store(nil)
	published := gpunode.WithOnPublish(func(g gpunode.GPUs) { r.tracker.Store(g.Health) })
	r.d = New(r.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), WithNode(gpunode.WithOpen(open), published), WithKubeClient(r.client),
		WithTimings(100*time.Millisecond, time.Second),
		WithHoldEndpoint(func(ctx context.Context, kubeletDir, resource string, _ *slog.Logger) error {
			r.holds <- [2]string{kubeletDir, resource}
			<-ctx.Done()
			return nil
		}),
		// Each round starts the driver: a republished layout starts it again.
		WithOnStart(func(*driver.Driver) { startOnce() }))
	r.done = make(chan error, 1)
	go func() { r.done <- r.d.Run(ctx) }()
	select {
	case <-started:
	case err := <-r.done:
		t.Fatalf("daemon ended before serving: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not start")
	}
	done := r.done
	r.stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon ended with %v", err)
		}
	})
	t.Cleanup(r.stop)
}

func (r *rig) restart(t testing.TB) {
	r.stop()
	r.start(t)
}

func dial(t testing.TB, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// register plays kubelet's plugin watcher: GetInfo, then accept.
func (r *rig) register(t testing.TB) *registerapi.PluginInfo {
	t.Helper()
	reg := registerapi.NewRegistrationClient(dial(t, filepath.Join(r.cfg.RegistrarDir, contract.DRADriver+"-reg.sock")))
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	until(t, "readiness after registration", func() bool { return r.d.Ready() == nil })
	until(t, "every GPU Healthy", func() bool {
		tr := r.tracker.Load()
		return tr != nil && !slices.ContainsFunc(tr.States(), func(s health.State) bool { return !s.Healthy })
	})
	return info
}

func until(t testing.TB, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func (r *rig) slice(t testing.TB) resourceapi.ResourceSlice {
	t.Helper()
	var got resourceapi.ResourceSlice
	until(t, "the ResourceSlice", func() bool {
		l, err := r.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return false
		}
		got = l.Items[0]
		return true
	})
	return got
}

func (r *rig) claim(t testing.TB, name, uid, device string) *drapbv1.Claim {
	t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: contract.DRADriver, Pool: nodeName, Device: device},
	}}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-pod", UID: types.UID(uid + "-pod")}}
	if _, err := r.client.ResourceV1().ResourceClaims("default").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &drapbv1.Claim{Namespace: "default", Name: name, Uid: uid}
}

// shareClaim is claim for a share of device (a GPU's share device) with
// memory and computePercent, as the scheduler allocates it.
func (r *rig) shareClaim(t testing.TB, name, uid, device, memory string, percent int64) *drapbv1.Claim {
	t.Helper()
	share := types.UID(uid + "-share")
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "share", Driver: contract.DRADriver, Pool: nodeName, Device: device, ShareID: &share, ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			contract.DRACapacityMemory: resource.MustParse(memory), contract.DRACapacityComputePercent: *resource.NewQuantity(percent, resource.DecimalSI)}},
	}}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-pod", UID: types.UID(uid + "-pod")}}
	if _, err := r.client.ResourceV1().ResourceClaims("default").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &drapbv1.Claim{Namespace: "default", Name: name, Uid: uid}
}

func (r *rig) dra(t testing.TB) drapbv1.DRAPluginClient {
	return drapbv1.NewDRAPluginClient(dial(t, filepath.Join(r.cfg.DriverPluginDir(), "dra.sock")))
}

// The whole node side of DRA over the real sockets: registration with the
// health service advertised, the ResourceSlice, NodePrepareResources with
// the shared CDI spec's name, idempotent and surviving a driver restart,
// and NodeUnprepareResources.
// TestHoldsResourceEndpoint: nvinject-dra holds an empty device-plugin
// endpoint for the DeviceClass's extended resource in --kubelet-dir, again
// after a restart, and none with --hold-resource-endpoint=false. (What the
// endpoint answers kubelet is gpunode/kubelet/endpoint's test.)
func TestHoldsResourceEndpoint(t *testing.T) {
	r := newRig(t, "sim:a100-80gb")
	want := [2]string{filepath.Join(r.dir, "dp"), contract.ResourceName}
	for _, when := range []string{"start", "restart"} {
		select {
		case got := <-r.holds:
			if got != want {
				t.Fatalf("%s: held the endpoint in %s for %s, want %s for %s", when, got[0], got[1], want[0], want[1])
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no endpoint held", when)
		}
		if when == "start" {
			r.restart(t)
		}
	}

	off := newRig(t, "sim:a100-80gb", "--hold-resource-endpoint=false")
	off.register(t)
	select {
	case got := <-off.holds:
		t.Errorf("held the endpoint in %s for %s with --hold-resource-endpoint=false", got[0], got[1])
	case <-time.After(300 * time.Millisecond):
	}
}

// heldTaints counts each device's held taints (NoSchedule) by value.
func heldTaints(s resourceapi.ResourceSlice) map[string]string {
	out := map[string]string{}
	for _, d := range s.Spec.Devices {
		for _, tt := range d.Taints {
			if tt.Key == contract.DRAHeldTaintKey && tt.Effect == resourceapi.DeviceTaintEffectNoSchedule {
				out[d.Name] += tt.Value
			}
		}
	}
	return out
}

// untilHeld waits until the node's one ResourceSlice has the held taints want.
func (r *rig) untilHeld(t testing.TB, what string, want map[string]string) {
	t.Helper()
	until(t, what, func() bool {
		l, err := r.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		return err == nil && len(l.Items) == 1 && maps.Equal(heldTaints(l.Items[0]), want)
	})
}

// TestDevicePluginPodKeepsItsGPU: a GPU a pod got from the device plugin
// before the node moved to DRA is tainted in the first ResourceSlice, and
// untainted once kubelet no longer lists the pod.
func TestDevicePluginPodKeepsItsGPU(t *testing.T) {
	pr := nodemovetest.Start(t, filepath.Join(t.TempDir(), "pr.sock"))
	uuid1 := sim.UUID("a100-80gb", 1)
	pr.Set(&podresv1.PodResources{Namespace: "default", Name: "vllm", Containers: []*podresv1.ContainerResources{{Name: "vllm",
		Devices: []*podresv1.ContainerDevices{{ResourceName: contract.ResourceName, DeviceIds: []string{uuid1}}}}}})

	r := newRig(t, "sim:a100-80gb*2", "--pod-resources-socket="+pr.Socket)
	if got := heldTaints(r.slice(t)); !maps.Equal(got, map[string]string{"gpu-1": contract.DRAHeldTaintValue}) {
		t.Fatalf("first slice held taints %v, want gpu-1 %s only", got, contract.DRAHeldTaintValue)
	}
	pr.Set()
	r.untilHeld(t, "the held taint's removal", map[string]string{})
}

// TestHeldFailsClosed: while kubelet's PodResources cannot be read (the
// socket is not there yet, then List fails), every device is tainted
// held=unknown, so no claim gets a GPU a device-plugin pod may hold; once
// it answers, only the real holder's GPU stays tainted.
func TestHeldFailsClosed(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "pr.sock")
	r := newRig(t, "sim:a100-80gb*2", "--pod-resources-socket="+sock)
	unknown := map[string]string{"gpu-0": contract.DRAHeldTaintUnknown, "gpu-1": contract.DRAHeldTaintUnknown}
	if got := heldTaints(r.slice(t)); !maps.Equal(got, unknown) {
		t.Fatalf("first slice without PodResources: held taints %v, want %v", got, unknown)
	}
	pr := nodemovetest.Start(t, sock)
	pr.Set(&podresv1.PodResources{Namespace: "default", Name: "vllm", Containers: []*podresv1.ContainerResources{{Name: "vllm",
		Devices: []*podresv1.ContainerDevices{{ResourceName: contract.ResourceName, DeviceIds: []string{sim.UUID("a100-80gb", 0)}}}}}})
	r.untilHeld(t, "PodResources read", map[string]string{"gpu-0": contract.DRAHeldTaintValue})
	pr.Fail(status.Error(codes.Unavailable, "kubelet restarting"))
	r.untilHeld(t, "List failing", unknown)
	pr.Set()
	r.untilHeld(t, "List answering again", map[string]string{})
}

// TestReleaseSlicesWhenMovedAway: with --owner-label, stopping on a node
// whose label no longer says dra deletes the ResourceSlice; a restart on a
// DRA node keeps it.
func TestReleaseSlicesWhenMovedAway(t *testing.T) {
	for _, tt := range []struct {
		label    string
		wantKept bool
	}{{contract.DRAModeDRA, true}, {contract.DRAModeDevicePlugin, false}, {"", false}} {
		t.Run("label="+tt.label, func(t *testing.T) {
			r := newRig(t, "sim:a100-80gb", "--owner-label="+contract.DRAModeLabel)
			r.register(t)
			r.slice(t)
			n, err := r.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n.Labels = map[string]string{}
			if tt.label != "" {
				n.Labels[contract.DRAModeLabel] = tt.label
			}
			if _, err := r.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			r.stop()
			l, err := r.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
			if err != nil || (len(l.Items) == 1) != tt.wantKept {
				t.Errorf("after stopping with %s=%q: %d slices (%v); kept=%v wanted", contract.DRAModeLabel, tt.label, len(l.Items), err, tt.wantKept)
			}
		})
	}
}

func TestPrepareOverSocketsAcrossRestart(t *testing.T) {
	r := newRig(t, "sim:a100-80gb*2")
	info := r.register(t)
	if !strings.Contains(strings.Join(info.SupportedVersions, ","), "DRAResourceHealth") || info.Name != contract.DRADriver {
		t.Errorf("registration info %+v: want driver %s with the DRAResourceHealth service", info, contract.DRADriver)
	}
	s := r.slice(t)
	if s.Spec.Driver != contract.DRADriver || s.Spec.NodeName == nil || *s.Spec.NodeName != nodeName || len(s.Spec.Devices) != 2 {
		t.Fatalf("slice = %+v", s.Spec)
	}
	uuid1 := sim.UUID("a100-80gb", 1)
	if u := s.Spec.Devices[1].Attributes["uuid"].StringValue; s.Spec.Devices[1].Name != "gpu-1" || u == nil || *u != uuid1 {
		t.Errorf("device 1 = %s %v, want gpu-1 with uuid %s", s.Spec.Devices[1].Name, u, uuid1)
	}
	spec, err := os.ReadFile(filepath.Join(r.cfg.CDISpecDir, "nvidia.com-gpu.yaml"))
	if err != nil || !strings.Contains(string(spec), uuid1) {
		t.Fatalf("the shared CDI spec lacks %s: %v", uuid1, err)
	}

	claim := r.claim(t, "vllm-gpu", "uid-1", "gpu-1")
	want := contract.CDIKind(contract.CDIVendor, contract.CDIClass) + "=" + uuid1
	check := func(c drapbv1.DRAPluginClient, when string) {
		t.Helper()
		resp, err := c.NodePrepareResources(context.Background(), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{claim}})
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		got := resp.Claims["uid-1"]
		if got.GetError() != "" || len(got.GetDevices()) != 1 || strings.Join(got.Devices[0].CdiDeviceIds, ",") != want {
			t.Fatalf("%s: prepare = %+v, want %s", when, got, want)
		}
	}
	c := r.dra(t)
	check(c, "first prepare")
	check(c, "repeated prepare")
	r.restart(t)
	r.register(t)
	c = r.dra(t)
	check(c, "prepare after a driver restart")
	// A second claim for the same GPU is refused, naming the holder.
	second := r.claim(t, "other", "uid-2", "gpu-1")
	resp, err := c.NodePrepareResources(context.Background(), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{second}})
	if err != nil || !strings.Contains(resp.Claims["uid-2"].GetError(), "default/vllm-gpu") {
		t.Fatalf("second claim on gpu-1: %v %v; want a refusal naming default/vllm-gpu", resp, err)
	}
	un, err := c.NodeUnprepareResources(context.Background(), &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{claim}})
	if err != nil || un.Claims["uid-1"].GetError() != "" {
		t.Fatalf("unprepare: %v %v", un, err)
	}
	resp, err = c.NodePrepareResources(context.Background(), &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{second}})
	if err != nil || resp.Claims["uid-2"].GetError() != "" {
		t.Fatalf("second claim after unprepare: %v %v", resp, err)
	}
}

// An Xid taints the device and the health stream says Unhealthy; recovery
// reverses both.
func TestXidTaintsAndHealthStream(t *testing.T) {
	r := newRig(t, "sim:a100-80gb")
	r.register(t)
	r.slice(t)
	uuid := sim.UUID("a100-80gb", 0)
	conn := dial(t, filepath.Join(r.cfg.DriverPluginDir(), "dra.sock"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitHealth := func(want drahealthv1.HealthStatus) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if d := resp.Devices[0]; d.Health == want && d.Device.DeviceName == "gpu-0" && d.Device.PoolName == nodeName {
				return
			}
		}
		t.Fatalf("health stream never said %s", want)
	}
	tainted := func() bool {
		l, err := r.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		return err == nil && len(l.Items) == 1 && len(l.Items[0].Spec.Devices[0].Taints) == 1 &&
			l.Items[0].Spec.Devices[0].Taints[0].Key == contract.DRATaintKey
	}
	waitHealth(drahealthv1.HealthStatus_HEALTHY)
	until(t, "an untainted slice", func() bool { return !tainted() })
	if err := r.sim.InjectXid(uuid, 79); err != nil {
		t.Fatal(err)
	}
	waitHealth(drahealthv1.HealthStatus_UNHEALTHY)
	until(t, "the taint", tainted)
	if err := r.tracker.Load().Recover(context.Background(), uuid); err != nil {
		t.Fatal(err)
	}
	waitHealth(drahealthv1.HealthStatus_HEALTHY)
	until(t, "the taint removed", func() bool { return !tainted() })
}
