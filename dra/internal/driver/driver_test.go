package driver_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// fakeHealth is a tracker whose states the test sets.
type fakeHealth struct {
	mu     sync.Mutex
	states []health.State
	subs   []chan struct{}
}

func (f *fakeHealth) States() []health.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]health.State(nil), f.states...)
}

func (f *fakeHealth) Subscribe() (<-chan struct{}, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{}, 1)
	f.subs = append(f.subs, ch)
	return ch, func() {}
}

func (f *fakeHealth) set(uuid, reason string) {
	f.mu.Lock()
	for i := range f.states {
		if f.states[i].UUID == uuid {
			f.states[i] = health.State{UUID: uuid, Healthy: reason == "", Reason: reason}
		}
	}
	subs := f.subs
	f.mu.Unlock()
	for _, ch := range subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

var node = gpu.Node{DriverVersion: "580.95.05", CUDAVersion: "13.0", Devices: []gpu.Device{
	{UUID: "GPU-aaa", Index: 0, Minor: 0, Name: "NVIDIA A100-SXM4-80GB", MemoryBytes: 80 << 30, PCIBusID: "0000:07:00.0", NUMANode: 0, Architecture: "Ampere", ComputeCapability: "8.0", MIGCapable: true},
	{UUID: "GPU-bbb", Index: 1, Minor: 1, Name: "NVIDIA A100-SXM4-80GB", MemoryBytes: 80 << 30, PCIBusID: "0000:0f:00.0", NUMANode: -1},
}}

func cdiName(uuid string) string { return "nvidia.com/gpu=" + uuid }

func newDriver(t *testing.T, dir string) (*driver.Driver, *fakeHealth) {
	t.Helper()
	h := &fakeHealth{states: []health.State{{UUID: "GPU-aaa", Healthy: true}, {UUID: "GPU-bbb", Healthy: true}}}
	st, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := driver.New("node-a", node, node.Devices, cdiName, h, st, driver.WithHealthTiming(20*time.Millisecond, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return d, h
}

func claim(uid, name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: "default", Name: name}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	return c
}

func result(pool, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: contract.DRADriver, Pool: pool, Device: device}
}

func prepare(t *testing.T, d *driver.Driver, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	t.Helper()
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 {
		t.Fatalf("%d results for one claim", len(res))
	}
	return res[c.UID]
}

// Prepare returns the shared spec's CDI name, is idempotent, and answers
// the same from the checkpoint after a driver restart; Unprepare undoes it.
func TestPrepareIdempotentAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	d, _ := newDriver(t, dir)
	c := claim("uid-1", "vllm-gpu", result("node-a", "gpu-1"))
	want := []string{"nvidia.com/gpu=GPU-bbb"}
	for i := 0; i < 2; i++ {
		r := prepare(t, d, c)
		if r.Err != nil || len(r.Devices) != 1 || strings.Join(r.Devices[0].CDIDeviceIDs, ",") != want[0] || r.Devices[0].DeviceName != "gpu-1" || r.Devices[0].PoolName != "node-a" {
			t.Fatalf("prepare #%d = %+v, want gpu-1 with %v", i+1, r, want)
		}
	}
	restarted, _ := newDriver(t, dir)
	// After a restart the claim object may have changed (or be gone); the
	// checkpoint answers.
	r := prepare(t, restarted, claim("uid-1", "vllm-gpu"))
	if r.Err != nil || len(r.Devices) != 1 || r.Devices[0].CDIDeviceIDs[0] != want[0] {
		t.Fatalf("prepare after restart = %+v, want the checkpointed %v", r, want)
	}
	for i := 0; i < 2; i++ {
		res, err := restarted.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "uid-1"}})
		if err != nil || res["uid-1"] != nil {
			t.Fatalf("unprepare #%d = %v, %v", i+1, res, err)
		}
	}
	// Unprepared: the GPU is free for another claim.
	if r := prepare(t, restarted, claim("uid-2", "other", result("node-a", "gpu-1"))); r.Err != nil {
		t.Fatalf("prepare after unprepare: %v", r.Err)
	}
}

func TestPrepareRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(d *driver.Driver, h *fakeHealth)
		claim *resourceapi.ResourceClaim
		want  string
	}{
		{"other pool", nil, claim("u", "c", result("node-b", "gpu-0")), "another node"},
		{"unknown device", nil, claim("u", "c", result("node-a", "gpu-7")), "not published"},
		{"unallocated", nil, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: "u", Namespace: "default", Name: "c"}}, "not allocated"},
		{"unhealthy", func(_ *driver.Driver, h *fakeHealth) { h.set("GPU-aaa", "Xid 79 at now") }, claim("u", "c", result("node-a", "gpu-0")), "Unhealthy (Xid 79"},
		{"held by another claim", func(d *driver.Driver, _ *fakeHealth) {
			_, _ = d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim("first", "holder", result("node-a", "gpu-0"))})
		}, claim("u", "c", result("node-a", "gpu-0")), "already prepared for ResourceClaim default/holder"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, h := newDriver(t, t.TempDir())
			if tc.setup != nil {
				tc.setup(d, h)
			}
			r := prepare(t, d, tc.claim)
			if r.Err == nil || !strings.Contains(r.Err.Error(), tc.want) || !strings.Contains(r.Err.Error(), "default/c") {
				t.Fatalf("err = %v, want one naming the claim default/c and %q", r.Err, tc.want)
			}
			// Nothing was checkpointed: the same claim fails the same way.
			if r2 := prepare(t, d, tc.claim); r2.Err == nil {
				t.Error("the refused claim was prepared on retry")
			}
		})
	}
}

// Other drivers' results in the same claim are not this driver's business.
func TestPrepareSkipsOtherDrivers(t *testing.T) {
	d, _ := newDriver(t, t.TempDir())
	other := resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "nic.example.com", Pool: "x", Device: "eth0"}
	r := prepare(t, d, claim("u", "c", other, result("node-a", "gpu-0")))
	if r.Err != nil || len(r.Devices) != 1 || r.Devices[0].DeviceName != "gpu-0" {
		t.Fatalf("prepare = %+v, want gpu-0 only", r)
	}
}

func device(t *testing.T, r resourceslice.DriverResources, name string) resourceapi.Device {
	t.Helper()
	for _, dv := range r.Pools["node-a"].Slices[0].Devices {
		if dv.Name == name {
			return dv
		}
	}
	t.Fatalf("no device %s in %+v", name, r)
	return resourceapi.Device{}
}

func TestResourcesAttributesAndTaints(t *testing.T) {
	d, h := newDriver(t, t.TempDir())
	g0 := device(t, d.Resources(), "gpu-0")
	attr := func(n string) resourceapi.DeviceAttribute { return g0.Attributes[resourceapi.QualifiedName(n)] }
	for name, got := range map[string]*string{
		"uuid": attr("uuid").StringValue, "productName": attr("productName").StringValue, "architecture": attr("architecture").StringValue,
		"resource.kubernetes.io/pciBusID": attr("resource.kubernetes.io/pciBusID").StringValue,
		"driverVersion":                   attr("driverVersion").VersionValue, "cudaDriverVersion": attr("cudaDriverVersion").VersionValue,
		"cudaComputeCapability": attr("cudaComputeCapability").VersionValue,
	} {
		want := map[string]string{"uuid": "GPU-aaa", "productName": "NVIDIA A100-SXM4-80GB", "architecture": "Ampere",
			"resource.kubernetes.io/pciBusID": "0000:07:00.0", "driverVersion": "580.95.5", "cudaDriverVersion": "13.0.0", "cudaComputeCapability": "8.0.0"}[name]
		if got == nil || *got != want {
			t.Errorf("attribute %s = %v, want %s", name, got, want)
		}
	}
	if v := attr("index").IntValue; v == nil || *v != 0 {
		t.Errorf("index = %v", v)
	}
	if v := attr("migCapable").BoolValue; v == nil || !*v {
		t.Errorf("migCapable = %v, want true (as the node label nvidia.com/mig.capable)", v)
	}
	if m := g0.Capacity["memory"].Value; m.Value() != 80<<30 {
		t.Errorf("memory = %s, want 80Gi", m.String())
	}
	g1 := device(t, d.Resources(), "gpu-1")
	if _, ok := g1.Attributes["numaNode"]; ok {
		t.Error("a GPU without NUMA node publishes numaNode")
	}
	if len(g0.Taints)+len(g1.Taints) != 0 {
		t.Fatalf("healthy GPUs are tainted: %v %v", g0.Taints, g1.Taints)
	}

	h.set("GPU-bbb", "Xid 79 at 2026-12-01T09:00:00Z")
	first := device(t, d.Resources(), "gpu-1").Taints
	if len(first) != 1 || first[0].Key != contract.DRATaintKey || first[0].Value != driver.TaintXid || first[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("taints of the Unhealthy GPU = %+v", first)
	}
	time.Sleep(10 * time.Millisecond)
	again := device(t, d.Resources(), "gpu-1").Taints
	if !again[0].TimeAdded.Equal(first[0].TimeAdded) {
		t.Errorf("republishing moved timeAdded from %v to %v", first[0].TimeAdded, again[0].TimeAdded)
	}
	h.set("GPU-bbb", "")
	if tt := device(t, d.Resources(), "gpu-1").Taints; len(tt) != 0 {
		t.Errorf("recovered GPU still tainted: %+v", tt)
	}
}

func TestTaintValue(t *testing.T) {
	for reason, want := range map[string]string{
		"Xid 79 at 2026-12-01T09:00:00Z":                                                driver.TaintXid,
		"GPU lost (fell off the bus or stopped answering); send SIGHUP after fixing it": driver.TaintLost,
		"health monitoring has not started yet":                                         driver.TaintMonitoring,
	} {
		if got := driver.TaintValue(reason); got != want {
			t.Errorf("TaintValue(%q) = %q, want %q", reason, got, want)
		}
	}
}

// The health stream sends a full report at once, again on a change, and
// again within the resend interval.
func TestWatchHealthStatus(t *testing.T) {
	d, h := newDriver(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error, 1)
	go func() { done <- d.WatchHealthStatus(ctx, reports) }()
	next := func() kubeletplugin.DeviceHealthReport {
		select {
		case r := <-reports:
			return r
		case <-time.After(2 * time.Second):
			t.Fatal("no health report")
		}
		return kubeletplugin.DeviceHealthReport{}
	}
	if r := next(); len(r.Devices) != 2 || r.Devices[0].Health != kubeletplugin.HealthStatusHealthy || r.Devices[0].HealthCheckTimeout != time.Second {
		t.Fatalf("first report = %+v", r)
	}
	h.set("GPU-aaa", "GPU lost (fell off the bus)")
	var r kubeletplugin.DeviceHealthReport
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if r = next(); r.Devices[0].Health == kubeletplugin.HealthStatusUnhealthy {
			break
		}
	}
	if r.Devices[0].Health != kubeletplugin.HealthStatusUnhealthy || r.Devices[0].DeviceName != "gpu-0" || !strings.Contains(r.Devices[0].Message, "GPU lost") {
		t.Fatalf("report after the loss = %+v", r.Devices[0])
	}
	next() // resent without a change
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchHealthStatus returned %v after cancel, want nil", err)
	}
}

type recordingPublisher struct {
	ch chan resourceslice.DriverResources
}

func (p recordingPublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	p.ch <- r
	return nil
}

// A health change republishes the slice with the taint.
func TestPublishOnHealthChange(t *testing.T) {
	d, h := newDriver(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	p := recordingPublisher{ch: make(chan resourceslice.DriverResources, 4)}
	done := make(chan error, 1)
	go func() { done <- d.Publish(ctx, p) }()
	<-p.ch
	h.set("GPU-aaa", "Xid 48 at now")
	select {
	case r := <-p.ch:
		if len(device(t, r, "gpu-0").Taints) != 1 {
			t.Errorf("republished without the taint: %+v", r)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no republish after a health change")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPublishHeldByDevicePlugin: a GPU a device-plugin pod holds is
// republished tainted beside its health taint, and untainted once free.
func TestPublishHeldByDevicePlugin(t *testing.T) {
	d, h := newDriver(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	p := recordingPublisher{ch: make(chan resourceslice.DriverResources, 4)}
	done := make(chan error, 1)
	go func() { done <- d.Publish(ctx, p) }()
	<-p.ch
	next := func(what string) resourceslice.DriverResources {
		t.Helper()
		select {
		case r := <-p.ch:
			return r
		case <-time.After(2 * time.Second):
			t.Fatalf("no republish after %s", what)
			return resourceslice.DriverResources{}
		}
	}
	d.SetHeld(map[string][]string{"GPU-bbb": {"default/vllm/main"}, "GPU-not-published": {"x/y/z"}})
	r := next("SetHeld")
	if tt := device(t, r, "gpu-1").Taints; len(tt) != 1 || tt[0].Key != contract.DRAHeldTaintKey || tt[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("held GPU taints = %+v, want %s:NoSchedule", tt, contract.DRAHeldTaintKey)
	}
	if tt := device(t, r, "gpu-0").Taints; len(tt) != 0 {
		t.Errorf("free GPU tainted: %+v", tt)
	}
	h.set("GPU-bbb", "Xid 79 at now")
	if tt := device(t, next("an Xid"), "gpu-1").Taints; len(tt) != 2 {
		t.Errorf("held and Unhealthy GPU taints = %+v, want both", tt)
	}
	h.set("GPU-bbb", "")
	next("recovery")
	d.SetHeld(map[string][]string{})
	if tt := device(t, next("the holder's end"), "gpu-1").Taints; len(tt) != 0 {
		t.Errorf("freed GPU still tainted: %+v", tt)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPublishHeldUnknown: while PodResources cannot be read every GPU is
// tainted held=unknown; the next SetHeld leaves only the real holders'.
func TestPublishHeldUnknown(t *testing.T) {
	d, _ := newDriver(t, t.TempDir())
	ctx, cancel := context.WithCancel(context.Background())
	p := recordingPublisher{ch: make(chan resourceslice.DriverResources, 4)}
	done := make(chan error, 1)
	go func() { done <- d.Publish(ctx, p) }()
	<-p.ch
	held := func(r resourceslice.DriverResources, dev string) string {
		t.Helper()
		for _, tt := range device(t, r, dev).Taints {
			if tt.Key == contract.DRAHeldTaintKey && tt.Effect == resourceapi.DeviceTaintEffectNoSchedule {
				return tt.Value
			}
		}
		return ""
	}
	d.SetHeldUnknown()
	r := <-p.ch
	if held(r, "gpu-0") != contract.DRAHeldTaintUnknown || held(r, "gpu-1") != contract.DRAHeldTaintUnknown {
		t.Errorf("held taints while unknown: gpu-0 %q, gpu-1 %q; want both %q", held(r, "gpu-0"), held(r, "gpu-1"), contract.DRAHeldTaintUnknown)
	}
	d.SetHeld(map[string][]string{"GPU-bbb": {"default/vllm/main"}})
	r = <-p.ch
	if held(r, "gpu-0") != "" || held(r, "gpu-1") != contract.DRAHeldTaintValue {
		t.Errorf("held taints once read: gpu-0 %q, gpu-1 %q; want none and %q", held(r, "gpu-0"), held(r, "gpu-1"), contract.DRAHeldTaintValue)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// kubelet may prepare a new claim for a GPU before it unprepared the claim
// of a force-deleted pod: a holder that is gone or deallocated in the API
// does not block; a live holder does.
func TestPrepareOverStaleHolder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		holder func(*resourceapi.ResourceClaim) *resourceapi.ResourceClaim
		ok     bool
	}{
		{"holder deleted", func(*resourceapi.ResourceClaim) *resourceapi.ResourceClaim { return nil }, true},
		{"holder recreated", func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
			n := c.DeepCopy()
			n.UID = "other-uid"
			return n
		}, true},
		{"holder deallocated", func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
			n := c.DeepCopy()
			n.Status.Allocation = nil
			return n
		}, true},
		{"holder no longer reserved", func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim { return c }, true},
		{"holder being deleted", func(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
			n := reserved(c)
			n.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			return n
		}, true},
		{"holder live", reserved, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &fakeHealth{states: []health.State{{UUID: "GPU-aaa", Healthy: true}, {UUID: "GPU-bbb", Healthy: true}}}
			st, err := checkpoint.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			first := claim("old", "old-pod-gpu", result("node-a", "gpu-0"))
			lookup := func(_ context.Context, ns, name string) (*resourceapi.ResourceClaim, error) {
				if name != first.Name || ns != first.Namespace {
					t.Errorf("lookup of %s/%s, want the holder", ns, name)
				}
				return tc.holder(first), nil
			}
			d, err := driver.New("node-a", node, node.Devices, cdiName, h, st, driver.WithClaimLookup(lookup))
			if err != nil {
				t.Fatal(err)
			}
			if r := prepare(t, d, first); r.Err != nil {
				t.Fatal(r.Err)
			}
			r := prepare(t, d, claim("new", "new-pod-gpu", result("node-a", "gpu-0")))
			if (r.Err == nil) != tc.ok {
				t.Fatalf("prepare over a holder that is %s: err = %v, want ok=%v", tc.name, r.Err, tc.ok)
			}
		})
	}
}

func reserved(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	n := c.DeepCopy()
	n.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "old-pod", UID: "pod-uid"}}
	return n
}
