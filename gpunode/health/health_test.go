package health

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nvinject/nvinject/shared/gpu"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-5000-8000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-5000-8000-000000000000"
)

// fakeSource hands the test the events channel of every watch; the first
// `fail` watches return an error at once. CheckHealth answers from a
// table the test edits.
type fakeSource struct {
	fail    int32
	started chan chan<- gpu.HealthEvent

	mu      sync.Mutex
	answers map[string]gpu.DeviceHealth
	broken  map[string]error
	checks  int
}

func newFake(fail int) *fakeSource {
	return &fakeSource{fail: int32(fail), started: make(chan chan<- gpu.HealthEvent, 8),
		answers: map[string]gpu.DeviceHealth{}, broken: map[string]error{}}
}

func (f *fakeSource) WatchHealth(ctx context.Context, _ []string, events chan<- gpu.HealthEvent) error {
	if atomic.AddInt32(&f.fail, -1) >= 0 {
		return errors.New("NVML: create an event set: Unknown Error")
	}
	events <- gpu.HealthEvent{Kind: gpu.EventWatching}
	f.started <- events
	<-ctx.Done()
	return nil
}

func (f *fakeSource) CheckHealth(_ context.Context, uuid string) (gpu.DeviceHealth, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checks++
	h := f.answers[uuid]
	h.ECCSupported = true
	return h, f.broken[uuid]
}

func (f *fakeSource) set(uuid string, h gpu.DeviceHealth, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers[uuid], f.broken[uuid] = h, err
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// run starts tr.Run and stops it when the test ends.
func run(t *testing.T, tr *Tracker, src Source) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tr.Run(ctx, src); close(done) }()
	t.Cleanup(func() { stop(); <-done })
}

// start runs a tracker and waits until it is monitored.
func start(t *testing.T, src *fakeSource, opts ...Option) (*Tracker, <-chan struct{}) {
	t.Helper()
	opts = append([]Option{WithLogger(quiet()), WithRetry(time.Millisecond, 5*time.Millisecond)}, opts...)
	tr := New([]string{gpuA, gpuB}, opts...)
	if tr.Healthy(gpuA) {
		t.Fatal("GPU is Healthy before monitoring started; want fail closed")
	}
	ch, cancel := tr.Subscribe()
	t.Cleanup(cancel)
	run(t, tr, src)
	select {
	case <-tr.Monitored():
	case <-time.After(5 * time.Second):
		t.Fatal("not monitored within 5s")
	}
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

func TestFirstStatesAreTheTruth(t *testing.T) {
	src := newFake(0)
	src.set(gpuB, gpu.DeviceHealth{RowRemapFailure: true}, nil)
	var changes [][]State
	tr, _ := start(t, src, WithOnChange(func(s []State) { changes = append(changes, s) }))
	st := tr.States()
	if !st[0].Healthy || st[1].Healthy || !strings.Contains(st[1].Reason, "row remapping failed") {
		t.Fatalf("states when monitored = %+v; want A Healthy and B Unhealthy for its row remapping failure", st)
	}
	// One change, from "not started" straight to the checked states: no
	// intermediate all-Healthy or all-Unhealthy list.
	if len(changes) != 1 {
		t.Fatalf("changes up to Monitored = %+v; want exactly one", changes)
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
		{name: "Xid 48 makes it Unhealthy", event: gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventXid, Xid: 48}, wantReason: "Xid 48"},
		{name: "Xid 79 marks it lost", event: gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventXid, Xid: 79}, wantReason: "fell off the bus"},
		{name: "lost GPU is Unhealthy", event: gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventLost}, wantReason: "GPU_IS_LOST"},
		{name: "unknown GPU changes nothing", event: gpu.HealthEvent{UUID: "GPU-x", Kind: gpu.EventXid, Xid: 79}, wantHealthy: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newFake(0)
			handled := make(chan struct{}, 1)
			tr, ch := start(t, src, WithIgnoredXids([]uint64{13, 43}), WithQuietPeriod(0),
				WithObserver(func(gpu.HealthEvent, bool) { handled <- struct{}{} }))
			drain(ch)
			(<-src.started) <- tt.event
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

// After the quiet period a GPU turns Healthy only if NVML vouches for it;
// a GPU that does not is checked again after each further quiet period.
func TestQuietPeriodAsksNVML(t *testing.T) {
	tests := []struct {
		name       string
		answer     gpu.DeviceHealth
		err        error
		wantReason string
	}{
		{name: "healthy answer"},
		{name: "retired pages pending", answer: gpu.DeviceHealth{RetiredPagesPending: true}, wantReason: "retired pages are pending"},
		{name: "row remapping failure", answer: gpu.DeviceHealth{RowRemapFailure: true}, wantReason: "row remapping failed"},
		{name: "row remapping pending", answer: gpu.DeviceHealth{RowRemapPending: true}, wantReason: "row remapping is pending"},
		{name: "ECC rising", answer: gpu.DeviceHealth{VolatileUncorrectedECC: 3}, wantReason: "rose from 0 to 3"},
		{name: "GPU not answering", err: errors.New("NVML: GPU is lost"), wantReason: "NVML check failed: NVML: GPU is lost"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newFake(0)
			tr, ch := start(t, src, WithQuietPeriod(200*time.Millisecond))
			rising := tt.answer.VolatileUncorrectedECC > 0
			if !rising {
				src.set(gpuB, tt.answer, tt.err)
			}
			events := <-src.started
			src.mu.Lock()
			checks := src.checks
			src.mu.Unlock()
			events <- gpu.HealthEvent{UUID: gpuB, Kind: gpu.EventXid, Xid: 48, Time: time.Now()}
			waitFor(t, ch, func() bool { return !tr.Healthy(gpuB) })
			if rising {
				// The ECC count rises after the Xid's baseline was taken.
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
					src.mu.Lock()
					n := src.checks
					src.mu.Unlock()
					if n > checks {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("no ECC baseline taken after the Xid")
					}
				}
				src.set(gpuB, tt.answer, tt.err)
			}
			if tt.wantReason == "" {
				waitFor(t, ch, func() bool { return tr.Healthy(gpuB) })
				return
			}
			waitFor(t, ch, func() bool { return strings.Contains(tr.States()[1].Reason, tt.wantReason) })
			if !strings.Contains(tr.States()[1].Reason, "Xid 48") {
				t.Errorf("reason %q lost the Xid", tr.States()[1].Reason)
			}
			// Fixed (and the ECC count steady at its new value): the next
			// quiet period's check turns it Healthy.
			src.set(gpuB, gpu.DeviceHealth{VolatileUncorrectedECC: tt.answer.VolatileUncorrectedECC}, nil)
			waitFor(t, ch, func() bool { return tr.Healthy(gpuB) })
		})
	}
}

func TestLostNeedsOperatorAndNVML(t *testing.T) {
	src := newFake(0)
	tr, ch := start(t, src, WithQuietPeriod(time.Millisecond))
	(<-src.started) <- gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventXid, Xid: 79}
	waitFor(t, ch, func() bool { return !tr.Healthy(gpuA) })
	time.Sleep(20 * time.Millisecond) // many quiet periods
	if tr.Healthy(gpuA) {
		t.Fatal("a GPU that fell off the bus recovered by itself")
	}
	ctx := context.Background()
	if err := tr.Recover(ctx, "GPU-nope"); !errors.Is(err, ErrUnknownGPU) {
		t.Fatalf("Recover(unknown) = %v", err)
	}
	src.set(gpuA, gpu.DeviceHealth{}, errors.New("NVML: GPU is lost"))
	if err := tr.Recover(ctx, gpuA); err == nil || !strings.Contains(err.Error(), "GPU is lost") {
		t.Fatalf("Recover of a GPU NVML cannot reach = %v; want the refusal", err)
	}
	if tr.Healthy(gpuA) {
		t.Fatal("Healthy after a Recover NVML did not vouch for")
	}
	src.set(gpuA, gpu.DeviceHealth{}, nil)
	if err := tr.RecoverAll(ctx); err != nil {
		t.Fatal(err)
	}
	if !tr.Healthy(gpuA) || !tr.Healthy(gpuB) {
		t.Fatalf("after RecoverAll: %+v", tr.States())
	}
}

func TestMonitorFailureFailsClosedThenRecovers(t *testing.T) {
	var states [][]State
	src := newFake(2)
	tr := New([]string{gpuA, gpuB}, WithLogger(quiet()),
		WithRetry(time.Millisecond, 2*time.Millisecond), WithOnChange(func(s []State) { states = append(states, s) }))
	ch, cancel := tr.Subscribe()
	defer cancel()
	run(t, tr, src)
	waitFor(t, ch, func() bool {
		st := tr.States()
		return strings.Contains(st[0].Reason, "health monitoring failed") && strings.Contains(st[0].Reason, "Unknown Error")
	})
	select {
	case <-tr.Monitored():
		t.Fatal("Monitored before any watch was armed")
	default:
	}
	<-src.started
	<-tr.Monitored()
	if !tr.Healthy(gpuA) || !tr.Healthy(gpuB) {
		t.Fatalf("armed watch: %+v", tr.States())
	}
	if len(states) < 2 {
		t.Fatalf("want a change to failed and one to healthy, got %v", states)
	}
}

func TestRecoverAfterRunEnded(t *testing.T) {
	src := newFake(0)
	tr := New([]string{gpuA}, WithLogger(quiet()))
	ctx, stop := context.WithCancel(context.Background())
	stop()
	tr.Run(ctx, src)
	if err := tr.Recover(context.Background(), gpuA); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Recover after Run = %v; want ErrNotRunning", err)
	}
}

func TestCheckpointKeepsMarksAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "health.json")
	src := newFake(0)
	first := New([]string{gpuA, gpuB}, WithLogger(quiet()), WithCheckpoint(path), WithQuietPeriod(0))
	ch, cancel := first.Subscribe()
	defer cancel()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { first.Run(ctx, src); close(done) }()
	<-first.Monitored()
	events := <-src.started
	events <- gpu.HealthEvent{UUID: gpuA, Kind: gpu.EventXid, Xid: 79}
	events <- gpu.HealthEvent{UUID: gpuB, Kind: gpu.EventXid, Xid: 48}
	waitFor(t, ch, func() bool { return !first.Healthy(gpuA) && !first.Healthy(gpuB) })
	stop()
	<-done

	for _, tt := range []struct {
		name  string
		quiet time.Duration
		wantB bool
	}{
		{name: "quiet period 0 keeps both", quiet: 0},
		{name: "quiet period over: B is checked and Healthy, the lost A is not", quiet: time.Millisecond, wantB: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := newFake(0)
			tr := New([]string{gpuA, gpuB}, WithLogger(quiet()), WithCheckpoint(path), WithQuietPeriod(tt.quiet))
			st := tr.States()
			if st[0].Healthy || !strings.Contains(st[0].Reason, "fell off the bus") || !strings.Contains(st[1].Reason, "Xid 48") {
				t.Fatalf("restored states = %+v", st)
			}
			ch, cancel := tr.Subscribe()
			defer cancel()
			run(t, tr, src)
			<-tr.Monitored()
			if tt.wantB {
				waitFor(t, ch, func() bool { return tr.Healthy(gpuB) })
			} else {
				time.Sleep(20 * time.Millisecond)
			}
			if tr.Healthy(gpuA) || tr.Healthy(gpuB) != tt.wantB {
				t.Fatalf("after the restart: %+v", tr.States())
			}
		})
	}
}

func TestBadCheckpointIsIgnoredWithAWarning(t *testing.T) {
	tests := map[string]string{
		"garbage":       "\x00\x01 not json",
		"foreign kind":  `{"kind":"example.com/other","version":1,"gpus":{}}`,
		"newer version": `{"kind":"nvinject.io/device-plugin-health","version":2,"gpus":{}}`,
		"bad entry":     `{"kind":"nvinject.io/device-plugin-health","version":1,"gpus":{"not-a-uuid":{"lost":"x"}}}`,
		"unknown field": `{"kind":"nvinject.io/device-plugin-health","version":1,"gpus":{},"extra":1}`,
		"too large":     `{"kind":"nvinject.io/device-plugin-health","version":1,"gpus":{},"pad":"` + strings.Repeat("x", maxCheckpoint) + `"}`,
	}
	for name, content := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "health.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			src := newFake(0)
			tr := New([]string{gpuA, gpuB}, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithCheckpoint(path))
			run(t, tr, src)
			<-tr.Monitored()
			if !tr.Healthy(gpuA) || !tr.Healthy(gpuB) {
				t.Fatalf("states = %+v; want Healthy from NVML's answer", tr.States())
			}
			if !strings.Contains(logs.String(), "ignoring the health checkpoint") {
				t.Errorf("no warning logged:\n%s", logs.String())
			}
			if marks, err := readCheckpoint(path); err != nil || len(marks) != 0 {
				t.Errorf("checkpoint not replaced by a valid empty one: %v, %v", marks, err)
			}
			entries, _ := os.ReadDir(dir)
			if len(entries) != 1 {
				t.Errorf("state dir holds %d entries; want only the checkpoint (no temporary files)", len(entries))
			}
		})
	}
}

func FuzzDecodeCheckpoint(f *testing.F) {
	f.Add(`{"kind":"nvinject.io/device-plugin-health","version":1,"gpus":{"GPU-1":{"lost":"Xid 79","xid":79,"xidAt":"2026-01-01T00:00:00Z"}}}`)
	f.Add(`{"kind":"x"}`)
	f.Fuzz(func(t *testing.T, content string) {
		marks, err := decodeCheckpoint(strings.NewReader(content))
		if err != nil {
			return
		}
		data, err := encodeCheckpoint(marks)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeCheckpoint(bytes.NewReader(data))
		if err != nil || len(again) != len(marks) {
			t.Fatalf("round trip of %v: %v, %v", marks, again, err)
		}
	})
}
