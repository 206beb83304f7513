package daemon

import (
	"context"
	"maps"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// migDevices are the MIG devices of every ResourceSlice (the counters may
// have one of their own), as their profile by UUID.
func (r *rig) migDevices(t *testing.T) map[string]string {
	t.Helper()
	l, err := r.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range l.Items {
		for _, d := range s.Spec.Devices {
			p, u := d.Attributes[contract.DRAAttrProfile], d.Attributes[contract.DRAAttrUUID]
			if p.StringValue != nil && u.StringValue != nil {
				out[*u.StringValue] = *p.StringValue
			}
		}
	}
	return out
}

// profiles are the MIG devices' profiles, sorted.
func profiles(devs map[string]string) []string {
	return slices.Sorted(maps.Values(devs))
}

// A MIG layout changed on the running node is republished in the
// ResourceSlice without a restart: the new MIG devices in, the destroyed
// one out, the daemon still running.
func TestMIGLayoutChangeRepublishesTheSlice(t *testing.T) {
	r := newRig(t, "sim:a100-80gb*2,mig=1:3g.40gb+2g.20gb", "--mig-rescan-interval=10ms")
	r.register(t)
	var first map[string]string
	until(t, "the first slice's MIG devices", func() bool {
		first = r.migDevices(t)
		return slices.Equal(profiles(first), []string{"2g.20gb", "3g.40gb"})
	})
	twoG := -1
	for u, p := range first {
		for gi := range 8 {
			if p == "2g.20gb" && u == sim.MIGUUID(sim.UUID("a100-80gb", 1), gi, 0) {
				twoG = gi
			}
		}
	}
	if err := r.sim.DestroyGPUInstance(1, twoG); err != nil {
		t.Fatalf("destroy the 2g.20gb (GI %d): %v", twoG, err)
	}
	for range 2 {
		if _, _, err := r.sim.CreateGPUInstance(1, "1g.10gb"); err != nil {
			t.Fatal(err)
		}
	}
	until(t, "the slice with the new layout", func() bool {
		return slices.Equal(profiles(r.migDevices(t)), []string{"1g.10gb", "1g.10gb", "3g.40gb"})
	})
	select {
	case err := <-r.done:
		t.Fatalf("the daemon ended (%v); a layout change must not restart it", err)
	default:
	}
}
