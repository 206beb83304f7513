package daemon

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// sliceWrites counts the ResourceSlice creates and updates sent to the API
// server so far.
func (r *rig) sliceWrites() int {
	n := 0
	for _, a := range r.client.Actions() {
		if a.GetResource().Resource == "resourceslices" && (a.GetVerb() == "create" || a.GetVerb() == "update") {
			n++
		}
	}
	return n
}

func xidTainted(s resourceapi.ResourceSlice) bool {
	for _, t := range s.Spec.Devices[0].Taints {
		if t.Key == contract.DRATaintKey {
			return true
		}
	}
	return false
}

// TestFlappingGPUSliceWritesBounded: a GPU flapping (Xid, then recovery)
// much faster than --health-update-interval costs at most one
// ResourceSlice write per interval plus the final one, the first Xid is
// written at once, and the slice ends in the true state (untainted).
func TestFlappingGPUSliceWritesBounded(t *testing.T) {
	const interval = 500 * time.Millisecond
	r := newRig(t, "sim:a100-80gb", "--health-update-interval="+interval.String())
	r.register(t)
	until(t, "an untainted slice", func() bool { return !xidTainted(r.slice(t)) })
	uuid := sim.UUID("a100-80gb", 0)
	tr := r.tracker.Load()
	changed, cancel := tr.Subscribe()
	defer cancel()
	before := r.sliceWrites()

	const flaps = 20
	began := time.Now()
	for i := range flaps {
		if err := r.sim.InjectXid(uuid, 48); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); tr.Healthy(uuid); {
			select {
			case <-changed:
			case <-time.After(time.Until(deadline)):
				t.Fatalf("flap %d: the Xid did not make the GPU Unhealthy in 10s", i)
			}
		}
		if i == 0 {
			until(t, "the first Xid's taint", func() bool { return xidTainted(r.slice(t)) })
		}
		if err := tr.Recover(context.Background(), uuid); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(began)

	// Quiet: no write for a few intervals.
	for last, since := r.sliceWrites(), time.Now(); time.Since(since) < 4*interval; time.Sleep(interval / 10) {
		if n := r.sliceWrites(); n != last {
			last, since = n, time.Now()
		}
	}
	if xidTainted(r.slice(t)) {
		t.Fatal("the slice is still tainted; want the true state, the GPU recovered")
	}
	if writes, limit := r.sliceWrites()-before, int(took/interval)+2; writes > limit {
		t.Errorf("%d slice writes for %d flaps in %s; want at most %d (one per %s, plus the final)", writes, flaps, took, limit, interval)
	}
}
