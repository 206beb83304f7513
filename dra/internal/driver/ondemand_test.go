package driver_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
)

// onDemandLayout is GPU 0 whole and GPU 1 with MIG mode on, no instance.
const onDemandLayout = "sim:a100-80gb*2,mig=1"

// simMaker makes MIG devices on the SIMULATED NVML through the backend
// (gpunode's MIGOnDemand without the CDI spec).
type simMaker struct{ b *backend.Backend }

func (m simMaker) Slots(d gpu.Device) ([]gpu.MIGSlot, error) { return m.b.MIGSlots(d) }
func (m simMaker) Create(_ context.Context, d gpu.Device, s gpu.MIGSlot) (gpu.MIGDevice, error) {
	return m.b.CreateMIG(d, s)
}
func (m simMaker) Destroy(_ context.Context, d gpu.Device, s gpu.MIGSlot) error {
	return m.b.DestroyMIG(d, s)
}

// onDemandNode is one simulated node whose drivers (one per start) share
// its NVML and checkpoint.
type onDemandNode struct {
	t      *testing.T
	b      *backend.Backend
	dir    string
	health *fakeHealth
}

func newOnDemandNode(t *testing.T) *onDemandNode {
	b, _, err := backend.OpenSimulated(onDemandLayout, backend.Options{DriverRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	n := &onDemandNode{t: t, b: b, dir: t.TempDir(), health: &fakeHealth{}}
	for _, g := range n.gpus() {
		n.health.states = append(n.health.states, health.State{UUID: g.UUID, Healthy: true})
	}
	return n
}

// gpus are the node's GPUs as NVML lists them now.
func (n *onDemandNode) gpus() []gpu.Device {
	node, err := n.b.Discover(context.Background())
	if err != nil {
		n.t.Fatal(err)
	}
	sel, _, err := gpuselect.Select(node.Devices, gpuselect.Selector{All: true}, gpuselect.MIGMixed)
	if err != nil {
		n.t.Fatal(err)
	}
	return sel
}

// start starts nvinject-dra over the node's current GPUs and checkpoint.
func (n *onDemandNode) start() (*driver.Driver, error) {
	node, err := n.b.Discover(context.Background())
	if err != nil {
		n.t.Fatal(err)
	}
	st, err := checkpoint.Open(n.dir)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { st.Close() })
	return driver.New("node-a", node, n.gpus(), cdiName, n.health, st, driver.WithMIGOnDemand(simMaker{n.b}))
}

func (n *onDemandNode) mustStart() *driver.Driver {
	d, err := n.start()
	if err != nil {
		n.t.Fatal(err)
	}
	return d
}

// instances are GPU 1's MIG devices by placement start.
func (n *onDemandNode) instances() map[int]gpu.MIGDevice {
	out := map[int]gpu.MIGDevice{}
	for _, m := range n.gpus()[1].MIG {
		out[m.Placement.Start] = m
	}
	return out
}

func unprepare(t *testing.T, d *driver.Driver, uid string) error {
	t.Helper()
	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: types.UID(uid)}})
	if err != nil {
		t.Fatal(err)
	}
	return res[types.UID(uid)]
}

// A GPU with MIG mode on and no instance publishes one device per
// placement of each profile (NVML's), type mig with its profile, parent and
// placement, consuming the memory slices it covers; the slices pass the
// API's limits. Kubernetes 1.37's allocator then never hands out two
// overlapping placements: seven 1g.10gb fit, an eighth and a 4g.40gb do
// not.
func TestMIGOnDemandPublishesPlacements(t *testing.T) {
	d := newOnDemandNode(t).mustStart()
	r := d.Resources()
	checkAPILimits(t, r)
	devs := poolDevices(r)
	profiles := map[string]int{}
	for name, dv := range devs {
		if name == "gpu-0" {
			continue
		}
		if str(dv, contract.DRAAttrType) != contract.DRATypeMIG || str(dv, contract.DRAAttrParentUUID) == "" || dv.Attributes[contract.DRAAttrMIGOnDemand].BoolValue == nil {
			t.Errorf("%s attributes %+v", name, dv.Attributes)
		}
		profiles[str(dv, contract.DRAAttrProfile)]++
	}
	want := map[string]int{"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
	if len(profiles) != len(want) {
		t.Fatalf("placements per profile %v, want %v", profiles, want)
	}
	for p, n := range want {
		if profiles[p] != n {
			t.Errorf("%s: %d placements, want %d", p, profiles[p], n)
		}
	}
	at2 := devs[contract.DRAMIGSlotDeviceName(1, "1g.10gb", 2)]
	if num(at2, contract.DRAAttrPlacementStart) != 2 || num(at2, contract.DRAAttrPlacementSize) != 1 ||
		len(at2.ConsumesCounters) != 1 || !slices.Equal(keys(at2.ConsumesCounters[0].Counters), []string{contract.DRACounterMemory, contract.DRACounterMemorySlice + "2"}) {
		t.Errorf("1g.10gb at 2: %+v consumes %+v", at2.Attributes, at2.ConsumesCounters)
	}

	s := newScheduler(t, r)
	byProfile := func(uid, profile string) *resourceapi.ResourceClaim {
		req := request(contract.DRADriver, nil)
		req.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.nvinject.io"].type == "mig" && device.attributes["gpu.nvinject.io"].profile == "` + profile + `"`}}}
		return unallocated(uid, uid, req)
	}
	var got []string
	for i := range 7 {
		c := byProfile("small-"+string(rune('a'+i)), "1g.10gb")
		if !s.allocate(c) {
			t.Fatalf("1g.10gb number %d does not fit", i+1)
		}
		got = append(got, c.Status.Allocation.Devices.Results[0].Device)
	}
	slices.Sort(got)
	if len(slices.Compact(got)) != 7 {
		t.Errorf("seven 1g.10gb got %v", got)
	}
	if s.allocate(byProfile("small-h", "1g.10gb")) || s.allocate(byProfile("big", "4g.40gb")) {
		t.Error("a placement overlapping the seven 1g.10gb was allocated")
	}
}

// A claim on a placement gets a MIG device made for it: its CDI device is
// the made MIG device's, the checkpoint names it, a repeated prepare and a
// restart answer the same, and unprepare destroys it.
func TestMIGOnDemandPrepareUnprepare(t *testing.T) {
	n := newOnDemandNode(t)
	d := n.mustStart()
	name := contract.DRAMIGSlotDeviceName(1, "1g.10gb", 2)
	c := claim("uid-mig", "mig", result("node-a", name))
	r := prepare(t, d, c)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	m, ok := n.instances()[2]
	if !ok || m.Profile != "1g.10gb" || len(n.instances()) != 1 {
		t.Fatalf("instances after prepare: %+v", n.instances())
	}
	if len(r.Devices) != 1 || r.Devices[0].DeviceName != name || !slices.Equal(r.Devices[0].CDIDeviceIDs, []string{cdiName(m.UUID)}) {
		t.Errorf("prepare = %+v, want %s with %s", r, name, cdiName(m.UUID))
	}
	if again := prepare(t, d, c); again.Err != nil || !slices.Equal(again.Devices[0].CDIDeviceIDs, r.Devices[0].CDIDeviceIDs) || len(n.instances()) != 1 {
		t.Errorf("a repeated prepare = %+v with %d instances", again, len(n.instances()))
	}

	// A restart keeps the claim's instance and publishes the GPU by its
	// placements still.
	d = n.mustStart()
	if _, ok := poolDevices(d.Resources())[contract.DRAMIGSlotDeviceName(1, "7g.80gb", 0)]; !ok {
		t.Error("after a restart the GPU with the claim's instance is not published by placements")
	}
	if again := prepare(t, d, c); again.Err != nil || !slices.Equal(again.Devices[0].CDIDeviceIDs, r.Devices[0].CDIDeviceIDs) {
		t.Errorf("prepare after a restart = %+v", again)
	}
	if err := unprepare(t, d, "uid-mig"); err != nil {
		t.Fatal(err)
	}
	if got := n.instances(); len(got) != 0 {
		t.Errorf("instances after unprepare: %+v", got)
	}
	if err := unprepare(t, d, "uid-mig"); err != nil {
		t.Errorf("a repeated unprepare: %v", err)
	}
}

// A prepare that fails leaves no instance and no checkpoint entry: NVML
// refuses a placement over another claim's instance, and a claim whose
// second device is refused loses the first it made.
func TestMIGOnDemandFailureLeavesNothing(t *testing.T) {
	n := newOnDemandNode(t)
	d := n.mustStart()
	if r := prepare(t, d, claim("uid-big", "big", result("node-a", contract.DRAMIGSlotDeviceName(1, "3g.40gb", 4)))); r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := prepare(t, d, claim("uid-over", "over", result("node-a", contract.DRAMIGSlotDeviceName(1, "1g.10gb", 5)))); r.Err == nil || !strings.Contains(r.Err.Error(), "taken by another GPU instance") {
		t.Errorf("a placement over another claim's instance: %v", r.Err)
	}
	two := claim("uid-two", "two", result("node-a", contract.DRAMIGSlotDeviceName(1, "1g.10gb", 0)), result("node-a", contract.DRAMIGSlotDeviceName(1, "2g.20gb", 4)))
	if r := prepare(t, d, two); r.Err == nil {
		t.Error("a claim whose second placement overlaps an instance was prepared")
	}
	if got := n.instances(); len(got) != 1 || got[4].Profile != "3g.40gb" {
		t.Errorf("instances after the failures: %+v, want the 3g.40gb only", got)
	}
	// The failed claim holds nothing: its first placement is free.
	if r := prepare(t, d, claim("uid-three", "three", result("node-a", contract.DRAMIGSlotDeviceName(1, "1g.10gb", 0)))); r.Err != nil {
		t.Errorf("the failed claim's placement: %v", r.Err)
	}
}

// Instances of a claim cut off mid-prepare (pending in the checkpoint) are
// destroyed at start and the claim forgotten.
func TestMIGOnDemandRestartCleansPending(t *testing.T) {
	n := newOnDemandNode(t)
	parent := n.gpus()[1]
	slots, err := n.b.MIGSlots(parent)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(slots, func(s gpu.MIGSlot) bool { return s.Profile == "2g.20gb" && s.Placement.Start == 2 })
	if _, err := n.b.CreateMIG(parent, slots[i]); err != nil {
		t.Fatal(err)
	}
	st, err := checkpoint.Open(n.dir)
	if err != nil {
		t.Fatal(err)
	}
	s := slots[i]
	err = st.Put(checkpoint.Claim{UID: "uid-cut", Namespace: "default", Name: "cut", Pending: true, Devices: []checkpoint.Device{{
		Requests: []string{"gpu"}, Pool: "node-a", Device: contract.DRAMIGSlotDeviceName(1, s.Profile, 2),
		MIG: &checkpoint.MIGSlot{ParentUUID: parent.UUID, ParentIndex: 1, Profile: s.Profile, GIProfile: s.GIProfile, Start: 2, Size: s.Placement.Size},
	}}})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	n.mustStart()
	if got := n.instances(); len(got) != 0 {
		t.Errorf("instances after the restart: %+v", got)
	}
	st, err = checkpoint.Open(n.dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Len() != 0 {
		t.Errorf("checkpoint after the restart: %+v", st.All())
	}
}

// Health works beside it: an Unhealthy parent taints its placements and
// refuses a claim on one, making nothing.
func TestMIGOnDemandUnhealthyParent(t *testing.T) {
	n := newOnDemandNode(t)
	d := n.mustStart()
	n.health.set(n.gpus()[1].UUID, "Xid 79: GPU has fallen off the bus")
	for name, dv := range poolDevices(d.Resources()) {
		if tainted := len(dv.Taints) > 0; tainted != (name != "gpu-0") {
			t.Errorf("%s taints %+v", name, dv.Taints)
		}
	}
	if r := prepare(t, d, claim("uid-sick", "sick", result("node-a", contract.DRAMIGSlotDeviceName(1, "1g.10gb", 0)))); r.Err == nil || !strings.Contains(r.Err.Error(), "Unhealthy") {
		t.Errorf("a claim on a placement of an Unhealthy GPU: %v", r.Err)
	}
	if got := n.instances(); len(got) != 0 {
		t.Errorf("instances: %+v", got)
	}
}
