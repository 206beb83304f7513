package driver_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/nvinject/nvinject/dra/internal/driver"
	gpumps "github.com/nvinject/nvinject/gpunode/mps"
	"github.com/nvinject/nvinject/shared/contract"
)

// classes are deploy/components/dra's DeviceClasses (deploy/render's test
// checks the same expressions).
type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, dc := range c {
		out = append(out, dc)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if dc, ok := c[name]; ok {
		return dc, nil
	}
	return nil, errors.New("no DeviceClass " + name)
}

var deployClasses = classes{
	contract.DRADriver:     deviceClass(contract.DRADriver, `device.driver == "gpu.nvinject.io" && device.attributes["gpu.nvinject.io"].type != "share"`),
	contract.DRAShareClass: deviceClass(contract.DRAShareClass, `device.driver == "gpu.nvinject.io" && device.attributes["gpu.nvinject.io"].type == "share"`),
}

func deviceClass(name, expr string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}}}
}

// apiSlices are r's slices as the API server stores them for node-a.
func apiSlices(r resourceslice.DriverResources) []*resourceapi.ResourceSlice {
	pool := r.Pools["node-a"]
	var out []*resourceapi.ResourceSlice
	nodeName := "node-a"
	for i, s := range pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "node-a-" + string(rune('a'+i))},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: contract.DRADriver, NodeName: &nodeName,
				Pool:           resourceapi.ResourcePool{Name: "node-a", Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				SharedCounters: s.SharedCounters, Devices: s.Devices,
			},
		})
	}
	return out
}

// scheduler is Kubernetes 1.37's structured allocator over one node's
// slices, with the allocations it made so far, as kube-scheduler keeps them.
type scheduler struct {
	t      *testing.T
	slices []*resourceapi.ResourceSlice
	state  structured.AllocatedState
	cache  *cel.Cache
}

func newScheduler(t *testing.T, r resourceslice.DriverResources) *scheduler {
	return &scheduler{t: t, slices: apiSlices(r), cache: cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}),
		state: structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}}
}

// allocate allocates c as the scheduler does (the default features of
// 1.37) and records the result; false when c does not fit.
func (s *scheduler) allocate(c *resourceapi.ResourceClaim) bool {
	s.t.Helper()
	features := structured.Features{AdminAccess: true, ConsumableCapacity: true, PartitionableDevices: true, DeviceTaints: true, PrioritizedList: true}
	a, err := structured.NewAllocator(context.Background(), features, s.state, deployClasses, s.slices, s.cache)
	if err != nil {
		s.t.Fatal(err)
	}
	res, err := a.Allocate(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, []*resourceapi.ResourceClaim{c})
	if err != nil {
		s.t.Fatalf("allocate %s: %v", c.Name, err)
	}
	if len(res) == 0 {
		return false
	}
	c.Status.Allocation = &res[0]
	for _, r := range res[0].Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			s.state.AllocatedDevices.Insert(id)
			continue
		}
		s.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		s.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	}
	return true
}

func request(class string, capacity map[string]string) resourceapi.DeviceRequest {
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
	if capacity != nil {
		req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range capacity {
			req.Exactly.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	return req
}

func unallocated(uid, name string, reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: "default", Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}}
}

func newShareDriver(t *testing.T, m *fakeMPS, stateDir, specDir string) *driver.Driver {
	t.Helper()
	opts := []driver.Option{driver.WithShares()}
	if m != nil {
		opts = append(opts, driver.WithMPS(m))
	}
	return newSharingDriver(t, stateDir, specDir, opts...)
}

// Each GPU gets a share device beside its whole device: type share, the
// GPU's UUID, memory and 100 computePercent as consumable capacity with
// request policies, multiple allocations allowed; the whole device consumes
// 1 and the share device 2 of the GPU's share counter (shareCounters). The
// slices pass the API's limits.
func TestResourcesShareDevice(t *testing.T) {
	d := newShareDriver(t, &fakeMPS{}, t.TempDir(), t.TempDir())
	r := d.Resources()
	checkAPILimits(t, r)
	devs := poolDevices(r)
	sh, ok := devs["gpu-0-share"]
	if !ok {
		t.Fatalf("no gpu-0-share in %v", slices.Sorted(maps.Keys(devs)))
	}
	if str(sh, contract.DRAAttrType) != contract.DRATypeShare || str(sh, contract.DRAAttrUUID) != "GPU-aaa" || num(sh, contract.DRAAttrIndex) != 0 {
		t.Errorf("share attributes %+v", sh.Attributes)
	}
	if sh.AllowMultipleAllocations == nil || !*sh.AllowMultipleAllocations {
		t.Error("share device does not allow multiple allocations")
	}
	mem := sh.Capacity[contract.DRACapacityMemory]
	if mem.Value.Cmp(resource.MustParse("80Gi")) != 0 || mem.RequestPolicy == nil || mem.RequestPolicy.Default.Cmp(resource.MustParse("1Gi")) != 0 ||
		mem.RequestPolicy.ValidRange.Step.Cmp(resource.MustParse("256Mi")) != 0 {
		t.Errorf("share memory capacity %+v", mem)
	}
	pct := sh.Capacity[contract.DRACapacityComputePercent]
	if pct.Value.Value() != 100 || pct.RequestPolicy == nil || pct.RequestPolicy.Default.Value() != driver.ShareComputeDefault {
		t.Errorf("share computePercent capacity %+v", pct)
	}
	whole := devs["gpu-0"]
	counter := func(dv resourceapi.Device) int64 {
		if len(dv.ConsumesCounters) != 1 || dv.ConsumesCounters[0].CounterSet != "gpu-0" || len(dv.ConsumesCounters[0].Counters) != 1 {
			t.Fatalf("%s consumes %+v, want gpu-0's share counter only", dv.Name, dv.ConsumesCounters)
		}
		q := dv.ConsumesCounters[0].Counters[contract.DRACounterShare]
		return q.Value.Value()
	}
	if whole.AllowMultipleAllocations != nil || counter(whole) != 1 || counter(sh) != 2 {
		t.Errorf("whole consumes %d, share %d; want 1 and 2 of the GPU's 2", counter(whole), counter(sh))
	}
	if len(devs) != 4 {
		t.Errorf("devices %v, want gpu-0, gpu-1 and their shares", slices.Sorted(maps.Keys(devs)))
	}
}

// Kubernetes 1.37's own allocator over the published slices: 40Gi and
// 30Gi shares fit on one 80 GB GPU, a third share of 20Gi more than is
// left goes to the other GPU and, once that is whole-allocated, fits
// nowhere; a whole GPU is never given beside a share, nor a share beside
// it; the default class (the example's nvidia.com/gpu) never gets a share.
func TestShareAllocationByKubernetesAllocator(t *testing.T) {
	d := newShareDriver(t, &fakeMPS{}, t.TempDir(), t.TempDir())
	s := newScheduler(t, d.Resources())
	a := unallocated("a", "a", request(contract.DRAShareClass, map[string]string{"memory": "40Gi", "computePercent": "50"}))
	if !s.allocate(a) {
		t.Fatal("40Gi share not allocated")
	}
	r := a.Status.Allocation.Devices.Results[0]
	if r.ShareID == nil || r.ConsumedCapacity[contract.DRACapacityMemory] != resource.MustParse("40Gi") {
		t.Fatalf("share result %+v", r)
	}
	b := unallocated("b", "b", request(contract.DRAShareClass, map[string]string{"memory": "30Gi"}))
	if !s.allocate(b) || b.Status.Allocation.Devices.Results[0].Device != r.Device {
		t.Fatalf("30Gi share not beside the 40Gi one: %+v", b.Status.Allocation)
	}
	if got := b.Status.Allocation.Devices.Results[0].ConsumedCapacity[contract.DRACapacityComputePercent]; got.Value() != driver.ShareComputeDefault {
		t.Errorf("default computePercent %v, want %d", got, driver.ShareComputeDefault)
	}
	whole := unallocated("w", "w", request(contract.DRADriver, nil))
	if !s.allocate(whole) {
		t.Fatal("the other GPU not allocated whole")
	}
	if got := whole.Status.Allocation.Devices.Results[0].Device; got == r.Device || strings.HasSuffix(got, "-share") || got == strings.TrimSuffix(r.Device, "-share") {
		t.Fatalf("whole GPU %s beside the shares of %s", got, r.Device)
	}
	c := unallocated("c", "c", request(contract.DRAShareClass, map[string]string{"memory": "30Gi"}))
	if s.allocate(c) {
		t.Fatalf("a 30Gi share with 10Gi left was allocated: %+v", c.Status.Allocation)
	}
	e := unallocated("e", "e", request(contract.DRADriver, nil))
	if s.allocate(e) {
		t.Fatalf("a whole GPU was allocated beside shares: %+v", e.Status.Allocation)
	}
	f := unallocated("f", "f", request(contract.DRAShareClass, map[string]string{"memory": "10Gi", "computePercent": "40"}))
	if !s.allocate(f) {
		t.Fatal("a share of exactly what is left was not allocated")
	}
}

func shareResult(device, shareID, memory string, pct int64) resourceapi.DeviceRequestAllocationResult {
	r := result("node-a", device)
	id := types.UID(shareID)
	r.ShareID = &id
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		contract.DRACapacityMemory: resource.MustParse(memory), contract.DRACapacityComputePercent: *resource.NewQuantity(pct, resource.DecimalSI),
	}
	return r
}

// A share is prepared with its own MPS daemon over its GPU whose limits are
// the share's capacity, its claim device carries them, and the answer names
// the share ID; a restarted driver runs the daemon again and answers the
// same; unprepare stops it. A whole GPU beside a live share, a share
// beside a whole GPU, a share without MPS daemons or a share ID, and a
// share with a sharing config are refused.
func TestPrepareShare(t *testing.T) {
	stateDir, specDir := t.TempDir(), t.TempDir()
	m := &fakeMPS{}
	d := newShareDriver(t, m, stateDir, specDir)
	a := claim("uid-a", "a", shareResult("gpu-0-share", "share-a", "40Gi", 50))
	b := claim("uid-b", "b", shareResult("gpu-0-share", "share-b", "30Gi", 25))
	resA := prepare(t, d, a)
	if resA.Err != nil {
		t.Fatal(resA.Err)
	}
	if res := prepare(t, d, b); res.Err != nil {
		t.Fatal(res.Err)
	}
	want := []gpumps.Daemon{
		{ID: "uid-a", Visible: "GPU-aaa", ActiveThreadPercentage: 50, PinnedMemoryMiB: 40 << 10},
		{ID: "uid-b", Visible: "GPU-aaa", ActiveThreadPercentage: 25, PinnedMemoryMiB: 30 << 10},
	}
	if got := sortDaemons(m.last()); !reflect.DeepEqual(got, want) {
		t.Errorf("daemons %+v, want %+v", got, want)
	}
	if got := resA.Devices[0]; got.ShareID == nil || *got.ShareID != "share-a" || !reflect.DeepEqual(got.CDIDeviceIDs, []string{"nvidia.com/gpu=GPU-aaa", "nvidia.com/claim=uid-a"}) {
		t.Errorf("share answer %+v", got)
	}
	data, err := os.ReadFile(filepath.Join(specDir, "nvidia.com-claim_uid-a.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{`"nvinject.io/gpu-share":"share-a"`, "CUDA_MPS_PIPE_DIRECTORY=/run/mps/uid-a/pipe", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M"} {
		if !strings.Contains(string(data), w) {
			t.Errorf("share's claim spec lacks %s:\n%s", w, data)
		}
	}

	for _, tc := range []struct {
		name string
		c    *resourceapi.ResourceClaim
		want string
	}{
		{"whole beside shares", claim("uid-w", "w", result("node-a", "gpu-0")), "given whole or in shares"},
		{"share without share ID", claim("uid-n", "n", result("node-a", "gpu-1-share")), "without a share ID"},
		{"share with a sharing config", withConfig(claim("uid-s", "s", shareResult("gpu-1-share", "share-s", "1Gi", 10)), resourceapi.AllocationConfigSourceClaim, contract.DRADriver, mps), "remove the GpuConfig's sharing"},
	} {
		if res := prepare(t, d, tc.c); res.Err == nil || !strings.Contains(res.Err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, res.Err, tc.want)
		}
	}

	m2 := &fakeMPS{}
	d2 := newShareDriver(t, m2, stateDir, specDir)
	if got := sortDaemons(m2.last()); !reflect.DeepEqual(got, want) {
		t.Errorf("restarted driver's daemons %+v, want %+v", got, want)
	}
	if res := prepare(t, d2, a); res.Err != nil || res.Devices[0].ShareID == nil || *res.Devices[0].ShareID != "share-a" {
		t.Errorf("prepare again after restart: %+v", res)
	}
	if _, err := d2.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: a.UID}, {UID: b.UID}}); err != nil {
		t.Fatal(err)
	}
	if got := m2.last(); len(got) != 0 {
		t.Errorf("daemons after unprepare %+v", got)
	}
	if res := prepare(t, d2, claim("uid-w", "w", result("node-a", "gpu-0"))); res.Err != nil {
		t.Errorf("whole GPU after its shares ended: %v", res.Err)
	}
	if res := prepare(t, d2, claim("uid-x", "x", shareResult("gpu-0-share", "share-x", "1Gi", 10))); res.Err == nil || !strings.Contains(res.Err.Error(), "given whole or in shares") {
		t.Errorf("share beside a whole GPU: %v", res.Err)
	}

	noMPS := newShareDriver(t, nil, t.TempDir(), t.TempDir())
	if res := prepare(t, noMPS, claim("uid-y", "y", shareResult("gpu-1-share", "share-y", "1Gi", 10))); res.Err == nil || !strings.Contains(res.Err.Error(), "cannot be enforced") {
		t.Errorf("share without MPS daemons: %v", res.Err)
	}
}

func sortDaemons(ds []gpumps.Daemon) []gpumps.Daemon {
	return slices.SortedFunc(slices.Values(ds), func(a, b gpumps.Daemon) int { return strings.Compare(a.ID, b.ID) })
}
