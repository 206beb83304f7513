package driver_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
)

// migLayout is the node: GPU 0 whole, GPU 1 with MIG on.
const migLayout = "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb*2"

// simGPUs discovers a simulated node and selects its GPUs as nvinject-dra
// does by default (mixed).
func simGPUs(t testing.TB, value string) (gpu.Node, []gpu.Device) {
	t.Helper()
	b, _, err := backend.OpenSimulated(value, backend.Options{DriverRoot: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	n, err := b.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	sel, _, err := gpuselect.Select(n.Devices, gpuselect.Selector{All: true}, gpuselect.MIGMixed)
	if err != nil {
		t.Fatal(err)
	}
	return n, sel
}

func newSimDriver(t testing.TB, value, dir string) (*driver.Driver, *fakeHealth, []gpu.Device) {
	t.Helper()
	n, sel := simGPUs(t, value)
	h := &fakeHealth{}
	for _, g := range sel {
		h.states = append(h.states, health.State{UUID: g.UUID, Healthy: true})
	}
	st, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d, err := driver.New("node-a", n, sel, cdiName, h, st)
	if err != nil {
		t.Fatal(err)
	}
	return d, h, sel
}

func poolDevices(r resourceslice.DriverResources) map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	for _, s := range r.Pools["node-a"].Slices {
		for _, dv := range s.Devices {
			out[dv.Name] = dv
		}
	}
	return out
}

func str(dv resourceapi.Device, name string) string {
	if v := dv.Attributes[resourceapi.QualifiedName(name)].StringValue; v != nil {
		return *v
	}
	return ""
}

func num(dv resourceapi.Device, name string) int64 {
	if v := dv.Attributes[resourceapi.QualifiedName(name)].IntValue; v != nil {
		return *v
	}
	return -1
}

// GPU 0 is published whole and consumes all of its counter set; GPU 1's
// three MIG devices consume disjoint memory slices of GPU 1's set and
// carry their own attributes.
func TestResourcesMIG(t *testing.T) {
	d, _, sel := newSimDriver(t, migLayout, t.TempDir())
	r := d.Resources()
	pool := r.Pools["node-a"].Slices
	if len(pool) != 2 || len(pool[0].Devices) != 0 || len(pool[0].SharedCounters) != 2 || len(pool[1].SharedCounters) != 0 {
		t.Fatalf("slices = %+v; want the counter sets, then the devices", pool)
	}
	sets := map[string]map[string]resourceapi.Counter{}
	for _, cs := range pool[0].SharedCounters {
		sets[cs.Name] = cs.Counters
	}
	devs := poolDevices(r)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range devs {
			if !yield(n) {
				return
			}
		}
	})
	want := []string{"gpu-0", "gpu-1-mig-1g10gb-gi1-ci0", "gpu-1-mig-1g10gb-gi2-ci0", "gpu-1-mig-3g40gb-gi0-ci0"}
	if !slices.Equal(names, want) {
		for _, m := range sel[1].MIG {
			t.Logf("MIG device %s GI %d CI %d placement %+v", m.Profile, m.GPUInstance, m.ComputeInstance, m.Placement)
		}
		t.Fatalf("devices %v, want %v", names, want)
	}

	g0 := devs["gpu-0"]
	if str(g0, "type") != "gpu" || str(g0, "uuid") != sel[0].UUID || num(g0, "index") != 0 {
		t.Errorf("gpu-0 attributes %+v", g0.Attributes)
	}
	if len(g0.ConsumesCounters) != 1 || g0.ConsumesCounters[0].CounterSet != "gpu-0" || !equalCounters(g0.ConsumesCounters[0].Counters, sets["gpu-0"]) {
		t.Errorf("gpu-0 consumes %+v, want all of its set %+v", g0.ConsumesCounters, sets["gpu-0"])
	}

	used := map[string]string{}
	var memory int64
	for _, m := range sel[1].MIG {
		name := contract.DRAMIGDeviceName(1, m.Profile, m.GPUInstance, m.ComputeInstance)
		dv := devs[name]
		for attr, want := range map[string]string{"type": "mig", "uuid": m.UUID, "parentUUID": sel[1].UUID, "profile": m.Profile, "productName": sel[1].Name} {
			if got := str(dv, attr); got != want {
				t.Errorf("%s: %s = %q, want %q", name, attr, got, want)
			}
		}
		if num(dv, "parentIndex") != 1 || num(dv, "migGI") != int64(m.GPUInstance) || num(dv, "migCI") != int64(m.ComputeInstance) {
			t.Errorf("%s: parentIndex/migGI/migCI = %d/%d/%d", name, num(dv, "parentIndex"), num(dv, "migGI"), num(dv, "migCI"))
		}
		if c := dv.Capacity["memory"].Value; c.Value() != int64(m.MemoryBytes) {
			t.Errorf("%s: memory capacity %s, want %d", name, c.String(), m.MemoryBytes)
		}
		if c := dv.Capacity["multiprocessors"].Value; c.Value() != int64(m.Multiprocessors) || m.Multiprocessors == 0 {
			t.Errorf("%s: multiprocessors %s, want %d", name, c.String(), m.Multiprocessors)
		}
		if len(dv.ConsumesCounters) != 1 || dv.ConsumesCounters[0].CounterSet != "gpu-1" {
			t.Fatalf("%s consumes %+v, want from gpu-1", name, dv.ConsumesCounters)
		}
		got := dv.ConsumesCounters[0].Counters
		if len(got) != m.Placement.Size+1 {
			t.Errorf("%s consumes %v, want memory and %d memory slices", name, got, m.Placement.Size)
		}
		for c, q := range got {
			if _, ok := sets["gpu-1"][c]; !ok {
				t.Errorf("%s consumes %s, which gpu-1's set lacks", name, c)
			}
			if c == "memory" {
				memory += q.Value.Value()
				continue
			}
			if other, taken := used[c]; taken {
				t.Errorf("%s and %s both consume %s", name, other, c)
			}
			used[c] = name
			if q.Value.Cmp(resource.MustParse("1")) != 0 {
				t.Errorf("%s consumes %s of %s, want 1", name, q.Value.String(), c)
			}
		}
	}
	if total := sets["gpu-1"]["memory"].Value; memory > total.Value() {
		t.Errorf("GPU 1's MIG devices consume %d bytes of memory, more than its %s", memory, total.String())
	}
	checkAPILimits(t, r)
}

// Compute instances of one GPU instance share its memory slices: each
// takes its share, so both can be allocated at once.
func TestResourcesMIGSharedGPUInstance(t *testing.T) {
	d, _, _ := newSimDriver(t, "sim:a100-80gb,mig=0:1c.3g.40gb*2", t.TempDir())
	r := d.Resources()
	sum := map[string]int64{}
	var n int
	for _, dv := range poolDevices(r) {
		n++
		for c, q := range dv.ConsumesCounters[0].Counters {
			sum[c] += q.Value.MilliValue()
		}
	}
	set := r.Pools["node-a"].Slices[0].SharedCounters[0].Counters
	if n != 2 || len(sum) < 2 {
		t.Fatalf("%d devices consuming %v", n, sum)
	}
	for c, total := range sum {
		if avail := set[c].Value; total > avail.MilliValue() || total == 0 {
			t.Errorf("the two compute instances consume %dm of %s, which has %s", total, c, avail.String())
		}
	}
	checkAPILimits(t, r)
}

// A node without MIG GPUs publishes as before: no counters, so the API
// server needs no DRAPartitionableDevices.
func TestResourcesNoMIGNoCounters(t *testing.T) {
	d, _, _ := newSimDriver(t, "sim:a100-80gb*2", t.TempDir())
	pool := d.Resources().Pools["node-a"].Slices
	if len(pool) != 1 || len(pool[0].SharedCounters) != 0 || len(pool[0].Devices) != 2 || pool[0].Devices[0].ConsumesCounters != nil {
		t.Fatalf("slices = %+v, want one slice of two devices without counters", pool)
	}
}

// Eight MIG GPUs of seven devices each: the limits still hold (counter
// sets 8 a slice, devices 64 a slice).
func TestResourcesMIGLimits(t *testing.T) {
	d, _, _ := newSimDriver(t, "sim:a100-80gb*8,mig=0+1+2+3+4+5+6+7:1g.10gb*7", t.TempDir())
	r := d.Resources()
	if n := len(poolDevices(r)); n != 56 {
		t.Fatalf("%d devices, want 56", n)
	}
	checkAPILimits(t, r)
}

func equalCounters(a, b map[string]resourceapi.Counter) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || v.Value.Cmp(w.Value) != 0 {
			return false
		}
	}
	return true
}

// checkAPILimits checks r against resource.k8s.io/v1's ResourceSlice
// validation (k8s.io/kubernetes pkg/apis/resource/validation, not
// importable here) and the pool checks of the resourceslice controller
// (validatePool, unexported).
func checkAPILimits(t *testing.T, r resourceslice.DriverResources) {
	t.Helper()
	sets := map[string]map[string]resourceapi.Counter{}
	seen := map[string]bool{}
	for i, s := range r.Pools["node-a"].Slices {
		if len(s.SharedCounters) > 0 && len(s.Devices) > 0 {
			t.Errorf("slice %d has both sharedCounters and devices", i)
		}
		if len(s.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
			t.Errorf("slice %d has %d counter sets, more than %d", i, len(s.SharedCounters), resourceapi.ResourceSliceMaxCounterSets)
		}
		for _, cs := range s.SharedCounters {
			if sets[cs.Name] != nil {
				t.Errorf("counter set %s twice", cs.Name)
			}
			sets[cs.Name] = cs.Counters
			dnsLabels(t, "counter set", append([]string{cs.Name}, keys(cs.Counters)...))
			if len(cs.Counters) == 0 || len(cs.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
				t.Errorf("counter set %s has %d counters", cs.Name, len(cs.Counters))
			}
		}
		advanced := false
		for _, dv := range s.Devices {
			advanced = advanced || len(dv.ConsumesCounters) > 0 || len(dv.Taints) > 0
		}
		if max := resourceapi.ResourceSliceMaxDevices; len(s.Devices) > max || advanced && len(s.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Errorf("slice %d has %d devices", i, len(s.Devices))
		}
	}
	for _, s := range r.Pools["node-a"].Slices {
		for _, dv := range s.Devices {
			if seen[dv.Name] {
				t.Errorf("device %s twice", dv.Name)
			}
			seen[dv.Name] = true
			dnsLabels(t, "device", []string{dv.Name})
			if n := len(dv.Attributes) + len(dv.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				t.Errorf("%s has %d attributes and capacities", dv.Name, n)
			}
			for name, a := range dv.Attributes {
				id := string(name)[strings.LastIndex(string(name), "/")+1:]
				if len(id) > resourceapi.DeviceMaxIDLength || len(validation.IsCIdentifier(id)) > 0 {
					t.Errorf("%s: attribute %s is not a C identifier of at most %d", dv.Name, name, resourceapi.DeviceMaxIDLength)
				}
				if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
					t.Errorf("%s: attribute %s is longer than %d", dv.Name, name, resourceapi.DeviceAttributeMaxValueLength)
				}
			}
			if len(dv.ConsumesCounters) > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
				t.Errorf("%s consumes from %d counter sets", dv.Name, len(dv.ConsumesCounters))
			}
			for _, c := range dv.ConsumesCounters {
				if len(c.Counters) > resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption {
					t.Errorf("%s consumes %d counters of %s", dv.Name, len(c.Counters), c.CounterSet)
				}
				set, ok := sets[c.CounterSet]
				if !ok {
					t.Errorf("%s consumes from counter set %s, which the pool lacks", dv.Name, c.CounterSet)
				}
				for name := range c.Counters {
					if _, ok := set[name]; !ok {
						t.Errorf("%s consumes counter %s, which set %s lacks", dv.Name, name, c.CounterSet)
					}
				}
			}
		}
	}
}

func keys(m map[string]resourceapi.Counter) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func dnsLabels(t *testing.T, what string, names []string) {
	t.Helper()
	for _, n := range names {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			t.Errorf("%s name %q: %v", what, n, errs)
		}
	}
}

// The README's claim selector picks the 1g.10gb MIG devices and nothing
// else. Whole GPUs have no profile: a selector without the type guard is a
// CEL runtime error on them, which fails the claim's allocation.
func TestMIGProfileCELSelector(t *testing.T) {
	d, _, _ := newSimDriver(t, migLayout, t.TempDir())
	match := func(expr string) ([]string, error) {
		prog := cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{})
		if prog.Error != nil {
			t.Fatal(prog.Error)
		}
		var matched []string
		for name, dv := range poolDevices(d.Resources()) {
			ok, _, err := prog.DeviceMatches(context.Background(), cel.Device{Driver: contract.DRADriver, Attributes: dv.Attributes, Capacity: dv.Capacity})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if ok {
				matched = append(matched, name)
			}
		}
		slices.Sort(matched)
		return matched, nil
	}
	expr := `device.attributes["gpu.nvinject.io"].type == "mig" && device.attributes["gpu.nvinject.io"].profile == "1g.10gb"`
	got, err := match(expr)
	if want := []string{"gpu-1-mig-1g10gb-gi1-ci0", "gpu-1-mig-1g10gb-gi2-ci0"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("%s matches %v, %v; want %v", expr, got, err, want)
	}
	if got, err := match(`device.attributes["gpu.nvinject.io"].type == "gpu"`); err != nil || !slices.Equal(got, []string{"gpu-0"}) {
		t.Errorf("type gpu matches %v, %v; want gpu-0", got, err)
	}
	if _, err := match(`device.attributes["gpu.nvinject.io"].profile == "1g.10gb"`); err == nil || !strings.Contains(err.Error(), "gpu-0: no such key: profile") {
		t.Errorf("the unguarded selector: %v, want no such key on gpu-0", err)
	}
}

// A MIG device prepares to its own CDI device and is checkpointed by its
// MIG UUID; after a layout change without it the checkpoint still answers
// and a new claim for it is refused, as for a vanished GPU.
func TestPrepareMIG(t *testing.T) {
	dir := t.TempDir()
	d, _, sel := newSimDriver(t, migLayout, dir)
	m := sel[1].MIG[1]
	name := contract.DRAMIGDeviceName(1, m.Profile, m.GPUInstance, m.ComputeInstance)
	r := prepare(t, d, claim("uid-mig", "mig", result("node-a", name)))
	if r.Err != nil || len(r.Devices) != 1 || !slices.Equal(r.Devices[0].CDIDeviceIDs, []string{cdiName(m.UUID)}) || r.Devices[0].DeviceName != name {
		t.Fatalf("prepare = %+v, want %s with %s", r, name, cdiName(m.UUID))
	}
	if r := prepare(t, d, claim("uid-other", "other", result("node-a", name))); r.Err == nil || !strings.Contains(r.Err.Error(), "MIG device "+name) {
		t.Errorf("a second claim on the MIG device: %v", r.Err)
	}
	if r := prepare(t, d, claim("uid-whole", "whole", result("node-a", "gpu-0"))); r.Err != nil {
		t.Errorf("the whole GPU 0 beside a MIG device of GPU 1: %v", r.Err)
	}
	relayout, _, _ := newSimDriver(t, "sim:a100-80gb*2", dir)
	if r := prepare(t, relayout, claim("uid-mig", "mig")); r.Err != nil || r.Devices[0].CDIDeviceIDs[0] != cdiName(m.UUID) {
		t.Errorf("prepare after the layout change = %+v, want the checkpointed answer", r)
	}
	if r := prepare(t, relayout, claim("uid-new", "new", result("node-a", name))); r.Err == nil || !strings.Contains(r.Err.Error(), "not published") {
		t.Errorf("a new claim for the vanished MIG device: %v", r.Err)
	}
}

// The checkpoint records the MIG device by its own UUID and CDI name.
func TestPrepareMIGCheckpoint(t *testing.T) {
	dir := t.TempDir()
	d, _, sel := newSimDriver(t, migLayout, dir)
	m := sel[1].MIG[0]
	name := contract.DRAMIGDeviceName(1, m.Profile, m.GPUInstance, m.ComputeInstance)
	if r := prepare(t, d, claim("uid-mig", "mig", result("node-a", name))); r.Err != nil {
		t.Fatal(r.Err)
	}
	st, err := checkpoint.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, ok := st.Get("uid-mig")
	if !ok || len(c.Devices) != 1 || c.Devices[0].Device != name || c.Devices[0].UUID != m.UUID || !slices.Equal(c.Devices[0].CDIDeviceIDs, []string{cdiName(m.UUID)}) {
		t.Errorf("checkpoint = %+v, %v; want %s by %s", c, ok, name, m.UUID)
	}
}

// An Unhealthy GPU taints every MIG device on it, and kubelet hears of
// each; the other GPU stays clean.
func TestUnhealthyParentTaintsMIG(t *testing.T) {
	d, h, sel := newSimDriver(t, migLayout, t.TempDir())
	h.set(sel[1].UUID, "Xid 79 at now")
	var tainted []string
	for name, dv := range poolDevices(d.Resources()) {
		if slices.ContainsFunc(dv.Taints, func(t resourceapi.DeviceTaint) bool {
			return t.Key == contract.DRATaintKey && t.Value == driver.TaintXid
		}) {
			tainted = append(tainted, name)
		}
	}
	slices.Sort(tainted)
	if want := []string{"gpu-1-mig-1g10gb-gi1-ci0", "gpu-1-mig-1g10gb-gi2-ci0", "gpu-1-mig-3g40gb-gi0-ci0"}; !slices.Equal(tainted, want) {
		t.Errorf("tainted %v, want %v", tainted, want)
	}
	health := map[string]kubeletplugin.DeviceHealth{}
	for _, dh := range d.HealthReport().Devices {
		health[dh.DeviceName] = dh
	}
	if len(health) != 4 || health["gpu-0"].Health != kubeletplugin.HealthStatusHealthy {
		t.Fatalf("health report %+v", health)
	}
	for _, name := range tainted {
		if dh := health[name]; dh.Health != kubeletplugin.HealthStatusUnhealthy || !strings.Contains(dh.Message, "MIG-") || !strings.Contains(dh.Message, "Xid 79") {
			t.Errorf("%s: health %+v", name, dh)
		}
	}
	if r := prepare(t, d, claim("uid-1", "x", result("node-a", tainted[0]))); r.Err == nil || !strings.Contains(r.Err.Error(), "Unhealthy") {
		t.Errorf("prepare of a MIG device on an Unhealthy GPU: %v", r.Err)
	}
}

// A GPU a device-plugin pod holds withholds its MIG devices; a held MIG
// device only itself.
func TestHeldParentWithholdsMIG(t *testing.T) {
	d, _, sel := newSimDriver(t, migLayout, t.TempDir())
	held := func() []string {
		var out []string
		for name, dv := range poolDevices(d.Resources()) {
			if slices.ContainsFunc(dv.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == contract.DRAHeldTaintKey }) {
				out = append(out, name)
			}
		}
		slices.Sort(out)
		return out
	}
	d.SetHeld(map[string][]string{sel[1].UUID: {"default/old/main"}})
	if got, want := held(), []string{"gpu-1-mig-1g10gb-gi1-ci0", "gpu-1-mig-1g10gb-gi2-ci0", "gpu-1-mig-3g40gb-gi0-ci0"}; !slices.Equal(got, want) {
		t.Errorf("parent held: tainted %v, want %v", got, want)
	}
	m := sel[1].MIG[2]
	d.SetHeld(map[string][]string{m.UUID: {"default/old/main"}})
	if got, want := held(), []string{contract.DRAMIGDeviceName(1, m.Profile, m.GPUInstance, m.ComputeInstance)}; !slices.Equal(got, want) {
		t.Errorf("MIG device held: tainted %v, want %v", got, want)
	}
	d.SetHeld(map[string][]string{})
	if got := held(); len(got) != 0 {
		t.Errorf("nothing held: tainted %v", got)
	}
}

func TestMIGDeviceName(t *testing.T) {
	for _, tc := range []struct {
		profile string
		want    string
	}{
		{"3g.40gb", "gpu-1-mig-3g40gb-gi1-ci0"},
		{"1g.10gb+me", "gpu-1-mig-1g10gb-me-gi1-ci0"},
		{"1c.3g.40gb", "gpu-1-mig-1c3g40gb-gi1-ci0"},
	} {
		got := contract.DRAMIGDeviceName(1, tc.profile, 1, 0)
		if got != tc.want || len(validation.IsDNS1123Label(got)) > 0 {
			t.Errorf("%s: %q, want %q (a DNS label)", tc.profile, got, tc.want)
		}
	}
}
