package sim_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

func TestInjectedFaultsReadBackThroughNVML(t *testing.T) {
	node, n, inv := discover(t, "sim:a100-80gb*2")
	a, b := node.Devices[0].UUID, node.Devices[1].UUID
	ctx := context.Background()
	check := func(uuid string) (gpu.DeviceHealth, error) {
		t.Helper()
		return inv.CheckHealth(ctx, uuid)
	}
	clean := gpu.DeviceHealth{ECCSupported: true}
	if h, err := check(a); err != nil || h != clean {
		t.Fatalf("fresh GPU: %+v, %v; want %+v", h, err, clean)
	}
	tests := []struct {
		fault sim.Fault
		want  gpu.DeviceHealth
	}{
		{sim.FaultRetiredPagesPending, gpu.DeviceHealth{ECCSupported: true, RetiredPagesPending: true}},
		{sim.FaultRowRemapFailure, gpu.DeviceHealth{ECCSupported: true, RowRemapFailure: true}},
		{sim.FaultRowRemapPending, gpu.DeviceHealth{ECCSupported: true, RowRemapPending: true}},
		{sim.FaultECC, gpu.DeviceHealth{ECCSupported: true, VolatileUncorrectedECC: 1}},
	}
	for _, tt := range tests {
		t.Run(string(tt.fault), func(t *testing.T) {
			if err := n.InjectFault(a, tt.fault); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = n.ClearFaults(a) })
			h, err := check(a)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			want.VolatileUncorrectedECC = max(want.VolatileUncorrectedECC, h.VolatileUncorrectedECC)
			if h != want {
				t.Errorf("health = %+v, want %+v", h, want)
			}
			if other, err := check(b); err != nil || other != clean {
				t.Errorf("the other GPU = %+v, %v; want it untouched", other, err)
			}
		})
	}
	if err := n.InjectFault(a, sim.FaultLost); err != nil {
		t.Fatal(err)
	}
	if _, err := check(a); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Errorf("lost GPU check = %v; want it not answering", err)
	}
	if err := n.ClearFaults(a); err != nil {
		t.Fatal(err)
	}
	if h, err := check(a); err != nil || h.VolatileUncorrectedECC != 1 || h.RowRemapFailure {
		t.Errorf("after ClearFaults: %+v, %v; want answering, ECC count kept at 1, faults gone", h, err)
	}
}

func TestFaultErrors(t *testing.T) {
	n := sim.New(sim.Spec{Model: "a100-80gb", Count: 1})
	if err := n.InjectFault("GPU-nope", sim.FaultECC); err == nil || !strings.Contains(err.Error(), sim.UUID("a100-80gb", 0)) {
		t.Errorf("unknown GPU: %v; want the error to list the simulated UUIDs", err)
	}
	if err := n.InjectFault(sim.UUID("a100-80gb", 0), "melted"); err == nil || !strings.Contains(err.Error(), "row-remap-failure") {
		t.Errorf("unknown fault: %v; want the known faults listed", err)
	}
	for _, s := range []string{"lost", "ecc", "retired-pages-pending"} {
		if f, err := sim.ParseFault(s); err != nil || string(f) != s {
			t.Errorf("ParseFault(%q) = %q, %v", s, f, err)
		}
	}
}
