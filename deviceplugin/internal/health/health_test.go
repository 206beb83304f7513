package health

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvinject/nvinject/shared/gpu"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-5000-8000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-5000-8000-000000000000"
)

// fakeWatcher hands the test the events channel of every watch; the first
// `fail` watches return an error at once.
type fakeWatcher struct {
	fail    int32
	started chan chan<- gpu.HealthEvent
}

func newFake(fail int) *fakeWatcher {
	return &fakeWatcher{fail: int32(fail), started: make(chan chan<- gpu.HealthEvent, 8)}
}

func (f *fakeWatcher) WatchHealth(ctx context.Context, _ []string, events chan<- gpu.HealthEvent) error {
	if atomic.AddInt32(&f.fail, -1) >= 0 {
		return errors.New("NVML: create an event set: Unknown Error")
	}
	f.started <- events
	<-ctx.Done()
	return nil
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// start runs a tracker and waits until both GPUs are monitored and Healthy.
func start(t *testing.T, w Watcher, opts ...Option) (*Tracker, <-chan struct{}) {
	t.Helper()
	opts = append([]Option{WithLogger(quiet()), WithStartGrace(10 * time.Millisecond), WithRetry(time.Millisecond, 5*time.Millisecond)}, opts...)
	tr := New([]string{gpuA, gpuB}, opts...)
	if tr.Healthy(gpuA) {
		t.Fatal("GPU is Healthy before monitoring started; want fail closed")
	}
	ch, cancel := tr.Subscribe()
	t.Cleanup(cancel)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.Run(ctx, w); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	waitFor(t, ch, func() bool { return tr.Healthy(gpuA) && tr.Healthy(gpuB) })
	return tr, ch
}

func waitFor(t *testing.T, ch <-chan struct{}, cond func() bool) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for !cond() {
		select {
		case <-ch:
		case <-timeout:
			t.Fatal("condition not reached in 5s")
		}
	}
}

func TestXidPolicy(t *testing.T) {
	tests := []struct {
		name        string
		event       gpu.HealthEvent
		wantHealthy bool
		wantReason  string
	}{
		{name: "application Xid 43 is ignored", event: gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventXid, Xid: 43}, wantHealthy: true},
		{name: "Xid 79 makes it Unhealthy", event: gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventXid, Xid: 79}, wantReason: "Xid 79"},
		{name: "lost GPU is Unhealthy", event: gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventLost}, wantReason: "GPU lost"},
		{name: "unknown GPU changes nothing", event: gpu.HealthEvent{UUID: "GPU-x", Kind: gpu.EventXid, Xid: 79}, wantHealthy: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newFake(0)
			handled := make(chan struct{}, 1)
			tr, ch := start(t, w, WithIgnoredXids([]uint64{13, 43}), WithQuietPeriod(0),
				WithObserver(func(gpu.HealthEvent, bool) { handled <- struct{}{} }))
			drain(ch)
			(<-w.started) <- tt.event
			<-handled
			st := tr.States()
			if st[0].Healthy != tt.wantHealthy || !strings.Contains(st[0].Reason, tt.wantReason) || !st[1].Healthy {
				t.Fatalf("states = %+v", st)
			}
			select {
			case <-ch:
				if tt.wantHealthy {
					t.Fatal("subscriber notified though nothing changed")
				}
			default:
				if !tt.wantHealthy {
					t.Fatal("subscriber not notified of the change")
				}
			}
		})
	}
}

func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func TestQuietPeriodRecovers(t *testing.T) {
	w := newFake(0)
	tr, ch := start(t, w, WithQuietPeriod(30*time.Millisecond))
	events := <-w.started
	events <- gpu.HealthEvent{UUID: gpuB, Kind: gpu.EventXid, Xid: 48, Time: time.Now()}
	waitFor(t, ch, func() bool { return !tr.Healthy(gpuB) })
	waitFor(t, ch, func() bool { return tr.Healthy(gpuB) })
}

func TestLostNeedsOperator(t *testing.T) {
	w := newFake(0)
	tr, ch := start(t, w, WithQuietPeriod(time.Millisecond))
	(<-w.started) <- gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventLost}
	waitFor(t, ch, func() bool { return !tr.Healthy(gpuA) })
	if err := tr.Recover("GPU-nope"); !errors.Is(err, ErrUnknownGPU) {
		t.Fatalf("Recover(unknown) = %v", err)
	}
	if err := tr.Recover(gpuA); err != nil {
		t.Fatal(err)
	}
	if !tr.Healthy(gpuA) {
		t.Fatalf("after Recover: %+v", tr.States())
	}
}

func TestMonitorFailureFailsClosedThenRecovers(t *testing.T) {
	var states [][]State
	w := newFake(2)
	tr := New([]string{gpuA, gpuB}, WithLogger(quiet()), WithStartGrace(10*time.Millisecond),
		WithRetry(time.Millisecond, 2*time.Millisecond), WithOnChange(func(s []State) { states = append(states, s) }))
	ch, cancel := tr.Subscribe()
	defer cancel()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.Run(ctx, w); close(done) }()
	waitFor(t, ch, func() bool {
		st := tr.States()
		return strings.Contains(st[0].Reason, "health monitoring failed") && strings.Contains(st[0].Reason, "Unknown Error")
	})
	<-w.started
	waitFor(t, ch, func() bool { return tr.Healthy(gpuA) && tr.Healthy(gpuB) })
	stop()
	<-done
	if len(states) < 2 {
		t.Fatalf("want a change to failed and one to healthy, got %v", states)
	}
}
