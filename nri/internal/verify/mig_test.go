package verify

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// simNode discovers a simulated node, as the NRI plugin's inventory does.
func simNode(t testing.TB, value string) gpu.Node {
	t.Helper()
	b, err := backend.Open(value, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n, err := b.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func nodeOf(d gpu.DeviceNode) Node {
	return Node{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor}
}

// slice is the unit a MIG device's CDI device stands for, its nodes and
// its env as the generator writes them.
func slice(d gpu.Device, m gpu.MIGDevice) (GPU, []Node, string) {
	g := GPU{UUID: m.UUID, Minor: m.Parent.Minor, MIG: MIG{GI: nodeOf(m.GIAccess), CI: nodeOf(m.CIAccess),
		ParentUUID: d.UUID, GPUIndex: strconv.Itoa(d.Index), Profile: m.Profile}}
	return g, []Node{nodeOf(m.Parent), nodeOf(m.GIAccess), nodeOf(m.CIAccess)}, fmt.Sprintf("%s%d=%s", EnvMIGUUIDPrefix, m.CIAccess.Minor, m.UUID)
}

func whole(d gpu.Device) (GPU, Node, string) {
	return GPU{UUID: d.UUID, Minor: int64(d.Minor)}, nodeOf(d.Node), fmt.Sprintf("%s%d=%s", EnvUUIDPrefix, d.Minor, d.UUID)
}

func TestCheckMIG(t *testing.T) {
	node := simNode(t, "sim:a100-80gb*3,mig=1:3g.40gb+1g.10gb*2")
	inv := InventoryOf(node)
	p := node.Devices[1]
	s0, n0, e0 := slice(p, p.MIG[0])
	s1, n1, e1 := slice(p, p.MIG[1])
	s2, n2, e2 := slice(p, p.MIG[2])
	w0, wn0, we0 := whole(node.Devices[0])
	ctl := nodeOf(node.ControlNodes[0])
	parent, gi1, ci1, ci2 := n1[0], n1[1], n1[2], n2[2]
	name1 := inv.MIG[s1.UUID].String()
	for _, tc := range []struct {
		name   string
		in     Input
		reason Reason
		found  []string
	}{
		{name: "its slice", in: Input{Allocated: []GPU{s1}, Nodes: append(n1, ctl), Env: []string{e1, "PATH=/bin"}, Inventory: inv, Kubelet: []string{s1.UUID}}},
		{name: "two slices of one GPU", in: Input{Allocated: []GPU{s1, s2}, Nodes: append(n1, n2[1:]...), Env: []string{e2, e1}, Inventory: inv}},
		{name: "a whole GPU and a slice of another", in: Input{Allocated: []GPU{w0, s0}, Nodes: append(n0, wn0), Env: []string{we0, e0}, Inventory: inv,
			Kubelet: []string{s0.UUID, w0.UUID}}},
		{name: "no inventory", in: Input{Allocated: []GPU{s1}, Nodes: n1, Env: []string{e1}}},
		{name: "another slice's CI node", in: Input{Allocated: []GPU{s1}, Nodes: append(n1, ci2), Env: []string{e1}, Inventory: inv},
			reason: ReasonForeignSlice, found: []string{ci2.Path, inv.MIG[s2.UUID].String(), "CI access node"}},
		{name: "another slice's GI node, no inventory", in: Input{Allocated: []GPU{s1}, Nodes: append(n1, n0[1]), Env: []string{e1}},
			reason: ReasonForeignSlice, found: []string{n0[1].Path, "a MIG capability node"}},
		{name: "config node", in: Input{Allocated: []GPU{s1}, Nodes: append(n1, nodeOf(node.MIGConfig)), Env: []string{e1}, Inventory: inv},
			reason: ReasonForeignSlice, found: []string{"nvidia-cap1", "config"}},
		{name: "monitor node by a device cgroup rule", in: Input{Allocated: []GPU{s1},
			Nodes: append(n1, Node{Path: "device cgroup rule 509:2", Type: "c", Major: node.MIGMonitor.Major, Minor: node.MIGMonitor.Minor}), Env: []string{e1}},
			reason: ReasonForeignSlice, found: []string{"device cgroup rule 509:2", "monitor"}},
		{name: "a bind mount of another slice's node", in: Input{Allocated: []GPU{s1}, Env: []string{e1},
			Nodes: append(n1, Node{Path: "bind mount of " + ci2.Path, Type: "c", Minor: ci2.Minor})}, reason: ReasonForeignSlice, found: []string{ci2.Path}},
		{name: "caps node in a container without GPUs", in: Input{Nodes: []Node{ci1}}, reason: ReasonForeignSlice, found: []string{ci1.Path}},
		{name: "missing CI node", in: Input{Allocated: []GPU{s1}, Nodes: []Node{parent, gi1}, Env: []string{e1}, Inventory: inv},
			reason: ReasonMissingSlice, found: []string{ci1.Path, "CI access node", name1}},
		{name: "missing GI node", in: Input{Allocated: []GPU{s1}, Nodes: []Node{parent, ci1}, Env: []string{e1}, Inventory: inv},
			reason: ReasonMissingSlice, found: []string{gi1.Path, "GI access node"}},
		{name: "missing parent", in: Input{Allocated: []GPU{s1}, Nodes: []Node{gi1, ci1}, Env: []string{e1}},
			reason: ReasonMissingSlice, found: []string{"/dev/nvidia1, the parent", "MIG 1g.10gb " + s1.UUID + " (GPU 1)"}},
		{name: "parent only, slice allocated", in: Input{Allocated: []GPU{s1}, Nodes: []Node{parent}, Env: []string{e1}, Inventory: inv},
			reason: ReasonMissingSlice, found: []string{gi1.Path}},
		{name: "parent only, nothing allocated", in: Input{Nodes: []Node{parent}, Inventory: inv}, reason: ReasonForeignGPU, found: []string{"/dev/nvidia1"}},
		{name: "parent named as a whole GPU", in: Input{Allocated: []GPU{s1}, Nodes: n1, Env: []string{e1, EnvUUIDPrefix + "1=" + p.UUID}, Inventory: inv},
			reason: ReasonEnv, found: []string{"parent of allocated " + name1, p.UUID}},
		{name: "env names another slice", in: Input{Allocated: []GPU{s1}, Nodes: n1, Env: []string{fmt.Sprintf("%s%d=%s", EnvMIGUUIDPrefix, ci1.Minor, s2.UUID)}},
			reason: ReasonEnv, found: []string{s2.UUID}},
		{name: "env names one slice more", in: Input{Allocated: []GPU{s1}, Nodes: n1, Env: []string{e1, e2}}, reason: ReasonEnv, found: []string{s2.UUID}},
		{name: "env lacks the slice", in: Input{Allocated: []GPU{s1}, Nodes: n1}, reason: ReasonEnv, found: []string{"expected [" + e1}},
		{name: "whole GPU and its own MIG device", in: Input{Allocated: []GPU{{UUID: p.UUID, Minor: 1}, s1}, Nodes: n1, Env: []string{e1}},
			reason: ReasonStaleSpec, found: []string{p.UUID, "never handed out whole"}},
		{name: "MIG GPU whole in the inventory", in: Input{Allocated: []GPU{{UUID: p.UUID, Minor: 1}}, Nodes: []Node{parent}, Inventory: inv},
			reason: ReasonStaleSpec, found: []string{"MIG mode is on"}},
		{name: "stale spec: slice's CI elsewhere", in: Input{Allocated: []GPU{{UUID: s1.UUID, Minor: 1, MIG: MIG{GI: gi1, CI: ci2}}}, Nodes: append(n1, ci2), Inventory: inv},
			reason: ReasonStaleSpec, found: []string{name1, fmt.Sprintf("nvidia-cap%d", ci2.Minor)}},
		{name: "stale spec: unknown MIG device", in: Input{Allocated: []GPU{{UUID: "MIG-gone", Minor: 1, MIG: s1.MIG}}, Nodes: n1, Inventory: inv},
			reason: ReasonStaleSpec, found: []string{"no MIG device MIG-gone"}},
		{name: "kubelet assigned another slice", in: Input{Allocated: []GPU{s1}, Nodes: n1, Env: []string{e1}, Kubelet: []string{s2.UUID}},
			reason: ReasonKubelet, found: []string{s1.UUID, s2.UUID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.in)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("unexpected refusal: %v", err)
				}
				return
			}
			var m *MismatchError
			if !errors.As(err, &m) || m.Reason != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
			t.Log(err)
			for _, f := range tc.found {
				if !strings.Contains(err.Error(), f) {
					t.Errorf("error %q should name %q", err, f)
				}
			}
			if n := len(err.Error()); n > 2048 {
				t.Errorf("error is %d bytes", n)
			}
		})
	}
}

func TestFromEditsMIG(t *testing.T) {
	node := simNode(t, "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb")
	p := node.Devices[1]
	s0, n0, e0 := slice(p, p.MIG[0])
	s1, n1, e1 := slice(p, p.MIG[1])
	w0, wn0, we0 := whole(node.Devices[0])
	ann := map[string]string{contract.MIGParentAnnotation: p.UUID, contract.GPUIndexAnnotation: "1", contract.MIGProfileAnnotation: p.MIG[1].Profile}
	ctl := nodeOf(node.ControlNodes[0])

	got, err := FromEdits("nvidia.com/gpu="+s1.UUID, append(n1, ctl), []string{e1}, ann)
	if err != nil || len(got) != 1 || got[0] != s1 {
		t.Fatalf("got %+v, %v; want %+v", got, err, s1)
	}
	// "all": the whole GPU, then the MIG GPU's parent node once.
	got, err = FromEdits("nvidia.com/gpu=all", append(append([]Node{wn0}, n0...), n1[1:]...), []string{we0, e0, e1}, nil)
	if err != nil || len(got) != 3 || got[0] != w0 || got[1].UUID != s0.UUID || got[2].UUID != s1.UUID || got[2].MIG.CI != s1.MIG.CI || got[2].Minor != 1 {
		t.Fatalf("all: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name, dev string
		nodes     []Node
		env       []string
		reason    Reason
	}{
		{name: "named after another slice", dev: s0.UUID, nodes: n1, env: []string{e1}, reason: ReasonStaleSpec},
		{name: "named after a GPU, describing a slice", dev: p.UUID, nodes: n1, env: []string{e1}, reason: ReasonStaleSpec},
		{name: "named after a slice, describing a GPU", dev: s1.UUID, nodes: []Node{wn0}, env: []string{we0}, reason: ReasonStaleSpec},
		{name: "parent named as a whole GPU", dev: s1.UUID, nodes: n1, env: []string{e1, EnvUUIDPrefix + "1=" + p.UUID}, reason: ReasonStaleSpec},
		{name: "GI node without a CI node", dev: "0", nodes: n1[:2], env: nil, reason: ReasonUnknownUUID},
		{name: "CI node without its GI node", dev: s1.UUID, nodes: []Node{n1[0], n1[2]}, env: []string{e1}, reason: ReasonStaleSpec},
		{name: "parent without a slice", dev: "1", nodes: n1[:1], env: nil, reason: ReasonUnknownUUID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromEdits("nvidia.com/gpu="+tc.dev, tc.nodes, tc.env, nil)
			var m *MismatchError
			if !errors.As(err, &m) || m.Reason != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
		})
	}
}

// BenchmarkCheck: the validator's cost for a container with the seven
// 1g.10gb MIG devices of one A100 against one with a whole GPU, both with
// the inventory, as the plugin runs it.
func BenchmarkCheck(b *testing.B) {
	mig := simNode(b, "sim:a100-80gb,mig=0:1g.10gb*7")
	plain := simNode(b, "sim:a100-80gb")
	ctl := nodeOf(mig.ControlNodes[0])
	var in7 Input
	in7.Inventory = InventoryOf(mig)
	for _, m := range mig.Devices[0].MIG {
		g, nodes, env := slice(mig.Devices[0], m)
		in7.Allocated, in7.Env = append(in7.Allocated, g), append(in7.Env, env)
		in7.Nodes = append(in7.Nodes, nodes...)
	}
	in7.Nodes = append(in7.Nodes, ctl)
	in7.Kubelet = UUIDs(in7.Allocated)
	g, n, e := whole(plain.Devices[0])
	in1 := Input{Allocated: []GPU{g}, Nodes: []Node{n, ctl}, Env: []string{e}, Inventory: InventoryOf(plain), Kubelet: []string{g.UUID}}
	for _, bc := range []struct {
		name string
		in   Input
	}{{"1-GPU", in1}, {"7-MIG", in7}} {
		b.Run(bc.name, func(b *testing.B) {
			if err := Check(bc.in); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				_ = Check(bc.in)
			}
		})
	}
}
