package health

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvinject/nvinject/gpunode/health/coalesce"
	"github.com/nvinject/nvinject/shared/gpu"
)

// runReported starts r.Run and stops it, waiting, when the test ends.
func runReported(t *testing.T, r *Reported) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
}

// TestReported: the first true states are reported at once, so is the
// first change after them; a change within the interval waits (an hour
// here, so nothing of it can show), while the tracker is never late.
func TestReported(t *testing.T) {
	src := newFake(0)
	tr := New([]string{gpuA, gpuB}, WithLogger(quiet()), WithQuietPeriod(0))
	var coalesced atomic.Int32
	r := NewReported(tr, time.Hour, coalesce.WithOnCoalesced(func() { coalesced.Add(1) }))
	if r.Healthy(gpuA) {
		t.Fatal("reported Healthy before monitoring started; want fail closed")
	}
	ch, cancel := r.Subscribe()
	defer cancel()
	runReported(t, r)
	run(t, tr, src)
	select {
	case <-r.Monitored():
	case <-time.After(5 * time.Second):
		t.Fatal("not monitored within 5s")
	}
	if got := r.States(); !slices.Equal(got, tr.States()) || !got[0].Healthy {
		t.Fatalf("reported %+v once monitored; want the tracker's %+v", got, tr.States())
	}
	events := <-src.started
	events <- gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventXid, Xid: 48}
	waitFor(t, ch, func() bool { return !r.Healthy(gpuA) })
	if err := tr.Recover(context.Background(), gpuA); err != nil {
		t.Fatal(err)
	}
	events <- gpu.HealthEvent{UUID: gpuB, Kind: gpu.EventXid, Xid: 48}
	for deadline := time.Now().Add(5 * time.Second); coalesced.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the change within the interval was not coalesced in 5s")
		}
	}
	if !tr.Healthy(gpuA) || tr.Healthy(gpuB) {
		t.Fatalf("tracker %+v; want A recovered and B Unhealthy", tr.States())
	}
	if r.Healthy(gpuA) || !r.Healthy(gpuB) {
		t.Fatalf("reported %+v within the interval; want the first change only (A Unhealthy)", r.States())
	}
}

// TestReportedEndsInTheTrueState: a GPU flapping faster than the interval
// is reported at most once per interval, and the reported health ends as
// the tracker's.
func TestReportedEndsInTheTrueState(t *testing.T) {
	const interval = 50 * time.Millisecond
	src := newFake(0)
	tr := New([]string{gpuA, gpuB}, WithLogger(quiet()), WithQuietPeriod(0))
	r := NewReported(tr, interval)
	ch, cancel := r.Subscribe()
	defer cancel()
	var reports atomic.Int32
	tch, tcancel := tr.Subscribe()
	defer tcancel()
	runReported(t, r)
	run(t, tr, src)
	<-r.Monitored()
	drain(ch)
	events := <-src.started
	counted := make(chan struct{})
	go func() {
		defer close(counted)
		for {
			select {
			case <-ch:
				reports.Add(1)
			case <-time.After(20 * interval):
				return
			}
		}
	}()
	began := time.Now()
	const flaps = 20
	for range flaps {
		events <- gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventXid, Xid: 48}
		waitFor(t, tch, func() bool { return !tr.Healthy(gpuA) })
		if err := tr.Recover(context.Background(), gpuA); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(began)
	<-counted
	if !slices.Equal(r.States(), tr.States()) || !r.Healthy(gpuA) {
		t.Fatalf("reported %+v; want the tracker's final %+v", r.States(), tr.States())
	}
	// At most one report per interval begun, plus the final one.
	if n, limit := int(reports.Load()), int(took/interval)+2; n > limit {
		t.Errorf("%d reports in %s of %d flaps; want at most %d", n, took, flaps, limit)
	}
}
