package devices

import (
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// node8 is a DGX-A100-like node: GPUs 0-3 on NUMA 0, 4-7 on NUMA 1, pairs
// (0,1), (2,3)... share a PCIe switch; NVLink only where nvlink says.
func node8(nvlink func(a, b int) bool) gpu.Node {
	n := gpu.Node{Links: map[string]map[string]gpu.Link{}}
	for i := range 8 {
		n.Devices = append(n.Devices, gpu.Device{UUID: sim.UUID("a100-80gb", i), Index: i, NUMANode: sim.NUMANode(i)})
	}
	for _, a := range n.Devices {
		n.Links[a.UUID] = map[string]gpu.Link{}
		for _, b := range n.Devices {
			if a.Index == b.Index {
				continue
			}
			l := gpu.Link{NVLink: nvlink(a.Index, b.Index), Level: 50}
			switch {
			case a.Index/2 == b.Index/2:
				l.Level = 20
			case a.NUMANode == b.NUMANode:
				l.Level = 40
			}
			n.Links[a.UUID][b.UUID] = l
		}
	}
	return n
}

func table(t *testing.T, n gpu.Node, id IDFunc) *Table {
	t.Helper()
	tb, err := New(n, units(n.Devices), id, func(u string) string { return "nvidia.com/gpu=" + u })
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

func idx(ids ...int) []string {
	out := make([]string, len(ids))
	for i, x := range ids {
		out[i] = ByIndex(gpuselect.Unit{GPU: gpu.Device{Index: x}})
	}
	return out
}

func units(devs []gpu.Device) []gpuselect.Unit {
	out := make([]gpuselect.Unit, len(devs))
	for i, d := range devs {
		out[i] = gpuselect.Unit{GPU: d}
	}
	return out
}

func sorted(s []string) []string { s = slices.Clone(s); sort.Strings(s); return s }

func TestPreferred(t *testing.T) {
	noNVLink := func(a, b int) bool { return false }
	nvlinkPairs := func(a, b int) bool { return a/2 == b/2 || (a == 1 && b == 6) || (a == 6 && b == 1) }
	tests := []struct {
		name      string
		nvlink    func(a, b int) bool
		available []string
		must      []string
		size      int
		want      []string
	}{
		{name: "same PCIe switch first", nvlink: noNVLink, available: idx(0, 2, 3, 4), size: 2, want: idx(2, 3)},
		{name: "same NUMA over cross-socket", nvlink: noNVLink, available: idx(1, 3, 4), size: 2, want: idx(1, 3)},
		{name: "NVLink beats NUMA", nvlink: nvlinkPairs, available: idx(1, 3, 6), size: 2, want: idx(1, 6)},
		{name: "four on one socket", nvlink: noNVLink, available: idx(0, 1, 2, 4, 5, 6, 7), size: 4, want: idx(4, 5, 6, 7)},
		{name: "must include honoured", nvlink: noNVLink, available: idx(0, 1, 4, 5), must: idx(4), size: 2, want: idx(4, 5)},
		{name: "unknown IDs skipped", nvlink: noNVLink, available: append(idx(6, 7), "99", "GPU-bad"), must: []string{"GPU-bad"}, size: 2, want: idx(6, 7)},
		{name: "too few available returns what there is", nvlink: noNVLink, available: idx(3), size: 2, want: idx(3)},
		{name: "must larger than size", nvlink: noNVLink, available: idx(0, 1, 2), must: idx(0, 2), size: 1, want: idx(0, 2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := table(t, node8(tt.nvlink), ByIndex)
			got := tb.Preferred(tt.available, tt.must, tt.size)
			if !slices.Equal(sorted(got), sorted(tt.want)) {
				t.Fatalf("Preferred(%v, %v, %d) = %v; want %v", tt.available, tt.must, tt.size, got, tt.want)
			}
		})
	}
}

func TestNewAndLookup(t *testing.T) {
	n := node8(func(int, int) bool { return false })
	tb := table(t, n, ByUUID)
	e, ok := tb.Lookup(n.Devices[3].UUID)
	if !ok || e.Device.Index != 3 || e.CDIName != "nvidia.com/gpu="+n.Devices[3].UUID {
		t.Fatalf("Lookup = %+v, %v", e, ok)
	}
	if _, ok := tb.Lookup("3"); ok {
		t.Fatal("index found under the uuid strategy")
	}
	if _, err := New(n, []gpuselect.Unit{{GPU: gpu.Device{UUID: "GPU-other"}}}, ByUUID, func(string) string { return "" }); err == nil {
		t.Fatal("New accepted a GPU that is not on the node")
	}
}

func BenchmarkPreferred8of16(b *testing.B) {
	n := gpu.Node{Links: map[string]map[string]gpu.Link{}}
	for i := range 16 {
		n.Devices = append(n.Devices, gpu.Device{UUID: sim.UUID("a100-80gb", i), Index: i, NUMANode: i / 8})
	}
	tb, _ := New(n, units(n.Devices), ByIndex, func(u string) string { return u })
	avail := idx(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
	for b.Loop() {
		tb.Preferred(avail, nil, 8)
	}
}

// migNode: GPU 0 whole, GPUs 1 and 2 with two 1g.10gb MIG devices each.
func migNode() (gpu.Node, []gpuselect.Unit) {
	n := gpu.Node{Links: map[string]map[string]gpu.Link{}}
	var us []gpuselect.Unit
	for i := range 3 {
		d := gpu.Device{UUID: sim.UUID("a100-80gb", i), Index: i, NUMANode: 0, MIGEnabled: i > 0}
		if i > 0 {
			for j := range 2 {
				d.MIG = append(d.MIG, gpu.MIGDevice{UUID: fmt.Sprintf("MIG-%d-%d", i, j), ParentUUID: d.UUID, Profile: "1g.10gb", GPUInstance: j + 1})
			}
		}
		n.Devices = append(n.Devices, d)
	}
	for _, d := range n.Devices[1:] {
		for j := range d.MIG {
			us = append(us, gpuselect.Unit{GPU: d, MIG: &d.MIG[j]})
		}
	}
	return n, us
}

func TestMIGAndReplicaIDs(t *testing.T) {
	n, us := migNode()
	for _, tc := range []struct {
		name     string
		id       IDFunc
		replicas int
		want     []string
	}{
		{"uuid", ByUUID, 1, []string{"MIG-1-0", "MIG-1-1", "MIG-2-0", "MIG-2-1"}},
		{"index", ByIndex, 1, []string{"1:0", "1:1", "2:0", "2:1"}},
		{"uuid, two replicas", ByUUID, 2, []string{"MIG-1-0::0", "MIG-1-0::1", "MIG-1-1::0", "MIG-1-1::1", "MIG-2-0::0", "MIG-2-0::1", "MIG-2-1::0", "MIG-2-1::1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, err := New(n, us, tc.id, func(u string) string { return "nvidia.com/gpu=" + u }, WithReplicas(tc.replicas))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range tb.Entries() {
				got = append(got, e.ID)
				if e.MIG == nil || e.CDIName != "nvidia.com/gpu="+e.MIG.UUID || e.Device.UUID != e.MIG.ParentUUID || e.UUID != e.MIG.UUID {
					t.Errorf("entry %+v: not its MIG device's", e)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("IDs %v, want %v", got, tc.want)
			}
		})
	}
}

// Two MIG devices go on one parent; two replicas never on one device.
func TestPreferredPacksMIGAndSpreadsReplicas(t *testing.T) {
	n, us := migNode()
	tb, err := New(n, us, ByUUID, func(u string) string { return u })
	if err != nil {
		t.Fatal(err)
	}
	if got := sorted(tb.Preferred([]string{"MIG-1-0", "MIG-2-0", "MIG-2-1"}, nil, 2)); !slices.Equal(got, []string{"MIG-2-0", "MIG-2-1"}) {
		t.Errorf("two MIG devices: %v, want both of GPU 2", got)
	}
	whole, err := New(n, units(n.Devices[:1]), ByUUID, func(u string) string { return u }, WithReplicas(4))
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, 4)
	for _, e := range whole.Entries() {
		ids = append(ids, e.ID)
	}
	if len(ids) != 4 || whole.Replicas() != 4 {
		t.Fatalf("4 replicas: %v", ids)
	}
}
