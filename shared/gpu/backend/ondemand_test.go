package backend_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// A GPU with MIG mode on and no instance lists its placements from NVML;
// CreateMIG makes the instance at one (Discover lists it with its access
// nodes), refuses an overlapping one leaving nothing behind, and DestroyMIG
// removes it; the node's other processes follow both. The GPU is SIMULATED (go-nvml's mock behind shared/gpu/sim).
func TestMIGOnDemandSimulated(t *testing.T) {
	root := t.TempDir()
	b, _, err := backend.OpenSimulated("sim:a100-80gb*2,mig=1", backend.Options{DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// Another process of the node (nvinject-nri) follows the driver root.
	other, _, err := backend.OpenSimulated("sim:a100-80gb*2,mig=1", backend.Options{DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	n, err := b.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	parent := n.Devices[1]
	slots, err := b.MIGSlots(parent)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, s := range slots {
		count[s.Profile]++
	}
	want := map[string]int{"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
	if fmt.Sprint(count) != fmt.Sprint(want) {
		t.Fatalf("placements per profile %v, want %v", count, want)
	}
	slot := func(profile string, start int) gpu.MIGSlot {
		for _, s := range slots {
			if s.Profile == profile && s.Placement.Start == start {
				return s
			}
		}
		t.Fatalf("no %s at %d in %+v", profile, start, slots)
		return gpu.MIGSlot{}
	}
	m, err := b.CreateMIG(parent, slot("1g.10gb", 2))
	if err != nil {
		t.Fatal(err)
	}
	if m.Profile != "1g.10gb" || m.Placement != (gpu.MIGPlacement{Start: 2, Size: 1}) || m.GIAccess.Path == "" || m.CIAccess.Path == "" {
		t.Errorf("made MIG device %+v", m)
	}
	if _, err := b.CreateMIG(parent, slot("3g.40gb", 0)); err == nil {
		t.Error("a 3g.40gb over slice 2 was made beside the 1g.10gb there")
	}
	n, err = b.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Devices[1].MIG; len(got) != 1 || got[0] != m {
		t.Errorf("after create and a refused overlap, the GPU has %+v, want only %+v", got, m)
	}
	if on, err := other.Discover(ctx); err != nil || len(on.Devices[1].MIG) != 1 || on.Devices[1].MIG[0].UUID != m.UUID {
		t.Errorf("another process on the node sees %+v (%v), want %s", on.Devices[1].MIG, err, m.UUID)
	}
	if err := b.DestroyMIG(parent, slot("1g.10gb", 2)); err != nil {
		t.Fatal(err)
	}
	if on, err := other.Discover(ctx); err != nil || len(on.Devices[1].MIG) != 0 {
		t.Errorf("after destroy another process sees %+v (%v)", on.Devices[1].MIG, err)
	}
	if err := b.DestroyMIG(parent, slot("1g.10gb", 2)); err != nil {
		t.Errorf("destroying a gone instance: %v", err)
	}
	if n, err = b.Discover(ctx); err != nil || len(n.Devices[1].MIG) != 0 {
		t.Errorf("after destroy: %+v, %v", n.Devices[1].MIG, err)
	}
}
