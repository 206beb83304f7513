package plugin_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
)

// MIG devices through the real NRI adaptation and nvinject's generated
// spec: a container gets its slice (the parent's node, its access nodes,
// its UUID env), the slices of one GPU serve two pods, one slice does not,
// and another slice's node or a whole GPU held elsewhere refuses it.
func TestMIGDevices(t *testing.T) {
	k := &kubelet{}
	e := start(t, envOpts{node: "sim:a100-80gb*3,mig=1:3g.40gb+1g.10gb*2", kubelet: serveKubelet(t, k), inventory: true})
	p := e.node.Devices[1]
	inv := verify.InventoryOf(e.node.Node)
	name := func(i int) string { return "nvidia.com/gpu=" + p.MIG[i].UUID }
	res := contract.MIGResourceName(contract.ResourceName, "1g.10gb")
	create := func(id string, mig int, kubeletIDs []string, mutate func(*oci.Spec)) (*oci.Spec, error) {
		t.Helper()
		pod := nritest.Pod(id, "nvidia", nil)
		k.assignAs(pod.GetName(), "main", res, kubeletIDs...)
		s := nritest.BaseSpec()
		if mutate != nil {
			mutate(s)
		}
		ctr := nritest.Container("ctr-"+id, id, "main", s, map[string]string{contract.DevicesAnnotation: name(mig)})
		adj, err := e.rt.Create(context.Background(), pod, ctr)
		if err != nil {
			return nil, err
		}
		nritest.Apply(t, s, adj)
		return s, nil
	}

	m := p.MIG[1]
	s, err := create("a", 1, []string{m.UUID}, nil)
	if err != nil {
		t.Fatalf("its slice refused: %v", err)
	}
	var got []string
	for _, d := range s.Linux.Devices {
		if d.Major == 195 && d.Minor < 254 || strings.HasPrefix(d.Path, contract.CapsDir) {
			got = append(got, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
		}
	}
	want := []string{fmt.Sprintf("/dev/nvidia1 195:%d", p.Minor), fmt.Sprintf("%s %d:%d", m.GIAccess.Path, m.GIAccess.Major, m.GIAccess.Minor),
		fmt.Sprintf("%s %d:%d", m.CIAccess.Path, m.CIAccess.Major, m.CIAccess.Minor)}
	if !slices.Equal(got, want) {
		t.Errorf("GPU and caps nodes = %v, want %v", got, want)
	}
	if v, _ := envOf(s, fmt.Sprintf("%s%d", contract.EnvMIGUUIDPrefix, m.CIAccess.Minor)); v != m.UUID {
		t.Errorf("MIG UUID env = %q, want %s", v, m.UUID)
	}
	if v, ok := envOf(s, fmt.Sprintf("%s%d", contract.EnvUUIDPrefix, p.Minor)); ok {
		t.Errorf("the parent is named as a whole GPU: %s", v)
	}
	if got := s.Annotations[plugin.UUIDsKey]; got != m.UUID {
		t.Errorf("annotation %s = %q, want %s", plugin.UUIDsKey, got, m.UUID)
	}

	// Kubelet's index ID of the other 1g.10gb slice ("<GPU>:<MIG index>").
	if _, err := create("b", 2, []string{"1:2"}, nil); err != nil {
		t.Errorf("another slice of the same GPU refused: %v", err)
	}

	before := refusals(t, e.reg, plugin.ReasonHeld)
	_, err = create("c", 1, []string{m.UUID}, nil)
	wantRefused(t, e, err, before, plugin.ReasonHeld, inv.MIG[m.UUID].String(), "pod default/pod-a")

	before = refusals(t, e.reg, string(verify.ReasonForeignSlice))
	other := p.MIG[2].CIAccess
	_, err = create("d", 0, []string{p.MIG[0].UUID}, func(s *oci.Spec) {
		s.Linux.Devices = append(s.Linux.Devices, oci.LinuxDevice{Path: other.Path, Type: "c", Major: other.Major, Minor: other.Minor})
	})
	wantRefused(t, e, err, before, string(verify.ReasonForeignSlice), other.Path, inv.MIG[p.MIG[2].UUID].String())

	before = refusals(t, e.reg, string(verify.ReasonKubelet))
	_, err = create("e", 0, []string{p.MIG[2].UUID}, nil)
	wantRefused(t, e, err, before, string(verify.ReasonKubelet), p.MIG[0].UUID, p.MIG[2].UUID)

	// kubelet lists another pod with the MIG GPU whole (a node moved
	// between MIG layouts without a drain): none of its slices is free.
	// The refused pods leave kubelet's list first.
	k.reset()
	k.assign("pod-whole", "main", p.UUID)
	before = refusals(t, e.reg, plugin.ReasonHeld)
	_, err = create("f", 0, []string{p.MIG[0].UUID}, nil)
	wantRefused(t, e, err, before, plugin.ReasonHeld, "is on GPU "+p.UUID, "pod default/pod-whole", "through the device plugin")
}
