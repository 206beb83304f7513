// Package health keeps each published GPU's health from NVML Xid and
// GPU-lost events, NVML's own health answers and a checkpoint, and applies
// the recovery policy:
//
//   - Nothing is published before monitoring runs: Monitored is closed once
//     the first watch is armed and every GPU was checked with NVML, so the
//     first list kubelet gets is already the true one.
//   - An Xid in the ignored list (application errors) changes nothing.
//   - Xid 79 (the GPU fell off the bus) and NVML's GPU_IS_LOST mark the GPU
//     lost: it stays Unhealthy until operator action (Recover/RecoverAll,
//     which the daemon wires to SIGHUP).
//   - Any other Xid makes the GPU Unhealthy; once no further such Xid
//     arrived for the quiet period (0: never by itself), NVML is asked.
//   - Before a GPU turns Healthy (at start, after the quiet period, on
//     operator action) NVML must say it is: the GPU answers, no retired
//     pages are pending, no row remapping failed or is pending, and its
//     volatile uncorrected ECC count has not risen since the last check.
//     A GPU that fails is checked again after each quiet period.
//   - While health monitoring is not running every GPU is Unhealthy: fail
//     closed.
//   - Lost and Xid marks are written to a checkpoint (WithCheckpoint) and
//     read back at start, so they survive plugin restarts.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nvinject/nvinject/shared/gpu"
)

// Source is what the tracker needs from NVML; gpu.Inventory satisfies it.
type Source interface {
	WatchHealth(ctx context.Context, uuids []string, events chan<- gpu.HealthEvent) error
	CheckHealth(ctx context.Context, uuid string) (gpu.DeviceHealth, error)
}

// State is one GPU's health as published.
type State struct {
	UUID    string
	Healthy bool
	// Reason says why the GPU is Unhealthy; empty when Healthy.
	Reason string
}

// lostXids are the Xids after which a GPU does not come back by itself.
var lostXids = map[uint64]string{79: "Xid 79: the GPU fell off the bus"}

// Tracker holds the GPUs' health and notifies subscribers on change.
type Tracker struct {
	log        *slog.Logger
	ignored    map[uint64]bool
	quiet      time.Duration
	retryMin   time.Duration
	retryMax   time.Duration
	observe    func(e gpu.HealthEvent, ignored bool)
	onChange   func([]State)
	checkpoint string
	carry      *Tracker
	order      []string
	// devs is filled by New and never changes; its values are guarded by mu.
	devs map[string]*device

	mu          sync.Mutex
	subs        map[chan struct{}]struct{}
	monitorDown string

	monitored     chan struct{}
	monitoredOnce sync.Once
	wake          chan struct{}
	reqs          chan request
	done          chan struct{}
}

type device struct {
	xid   uint64
	xidAt time.Time
	// lost says why the GPU is lost; empty when it is not.
	lost string
	// check says why NVML's last answer was not healthy; empty when it was.
	check string
	// ecc is the volatile uncorrected ECC count at the last look, when known.
	ecc      uint64
	eccKnown bool
	// gen counts marks; a recheck scheduled under an older gen is stale.
	gen      uint64
	recheck  *time.Timer
	checkDue bool
}

type request struct {
	uuid string // "" for every GPU
	resp chan error
}

// Option configures a Tracker.
type Option func(*Tracker)

// WithIgnoredXids sets the Xids that leave a GPU Healthy.
func WithIgnoredXids(xids []uint64) Option {
	return func(t *Tracker) {
		t.ignored = map[uint64]bool{}
		for _, x := range xids {
			t.ignored[x] = true
		}
	}
}

// WithQuietPeriod sets how long after its last Xid (or failed NVML check)
// a GPU is checked again to turn Healthy; 0 waits for Recover.
func WithQuietPeriod(d time.Duration) Option { return func(t *Tracker) { t.quiet = d } }

// WithRetry bounds the backoff between attempts to restart monitoring.
func WithRetry(minWait, maxWait time.Duration) Option {
	return func(t *Tracker) { t.retryMin, t.retryMax = minWait, maxWait }
}

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(t *Tracker) { t.log = l } }

// WithObserver is called after every event was applied, e.g. to count them.
func WithObserver(f func(e gpu.HealthEvent, ignored bool)) Option {
	return func(t *Tracker) { t.observe = f }
}

// WithOnChange is called, outside the lock, with the new states after
// every change.
func WithOnChange(f func([]State)) Option { return func(t *Tracker) { t.onChange = f } }

// WithCheckpoint keeps the lost and Xid marks in the file at path: read
// in New (a missing, corrupt or foreign file is ignored with a warning)
// and rewritten atomically after every change.
func WithCheckpoint(path string) Option { return func(t *Tracker) { t.checkpoint = path } }

// WithCarry starts from the lost and Xid marks of prev, a tracker whose
// Run has returned: the GPUs of a republished layout keep their health
// with or without a checkpoint.
func WithCarry(prev *Tracker) Option { return func(t *Tracker) { t.carry = prev } }

// New tracks uuids. They are Unhealthy until Run has armed a watch and
// checked them.
func New(uuids []string, opts ...Option) *Tracker {
	t := &Tracker{
		log: slog.Default(), quiet: 5 * time.Minute,
		retryMin: time.Second, retryMax: time.Minute,
		observe: func(gpu.HealthEvent, bool) {}, onChange: func([]State) {},
		order: slices.Clone(uuids), devs: map[string]*device{}, subs: map[chan struct{}]struct{}{},
		monitorDown: "health monitoring has not started yet",
		monitored:   make(chan struct{}), wake: make(chan struct{}, 1), reqs: make(chan request), done: make(chan struct{}),
	}
	for _, o := range opts {
		o(t)
	}
	for _, u := range uuids {
		t.devs[u] = &device{}
	}
	switch {
	case t.carry != nil:
		t.apply(t.carry.marks(), "the layout published before")
		t.carry = nil
	case t.checkpoint != "":
		t.restore()
	}
	return t
}

// Monitored is closed once the first health watch is armed and every GPU
// was checked with NVML: from then on States is the true health.
func (t *Tracker) Monitored() <-chan struct{} { return t.monitored }

// States returns every GPU's health in publication order.
func (t *Tracker) States() []State {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.statesLocked()
}

func (t *Tracker) statesLocked() []State {
	out := make([]State, len(t.order))
	for i, u := range t.order {
		out[i] = State{UUID: u, Reason: t.reasonLocked(t.devs[u])}
		out[i].Healthy = out[i].Reason == ""
	}
	return out
}

func (t *Tracker) reasonLocked(d *device) string {
	var parts []string
	switch {
	case d.lost != "":
		parts = append(parts, d.lost+"; fix it, then send SIGHUP (the plugin asks NVML before trusting it again)")
	case !d.xidAt.IsZero():
		parts = append(parts, fmt.Sprintf("Xid %d at %s", d.xid, d.xidAt.Format(time.RFC3339)))
	}
	if d.check != "" {
		parts = append(parts, d.check)
	}
	if len(parts) == 0 && t.monitorDown != "" {
		parts = append(parts, t.monitorDown)
	}
	return strings.Join(parts, "; ")
}

// Healthy reports whether the GPU with uuid is tracked and Healthy.
func (t *Tracker) Healthy(uuid string) bool {
	d, ok := t.devs[uuid]
	if !ok {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reasonLocked(d) == ""
}

// Subscribe returns a channel that receives a value after changes; a
// subscriber that does not read misses nothing but the intermediate
// states, and never blocks the tracker. Call cancel when done.
func (t *Tracker) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	t.mu.Lock()
	t.subs[ch] = struct{}{}
	t.mu.Unlock()
	return ch, func() {
		t.mu.Lock()
		delete(t.subs, ch)
		t.mu.Unlock()
	}
}

// update runs f under the lock; when the published states changed it
// notifies subscribers, and when the lasting marks changed it rewrites
// the checkpoint. Only Run's goroutine calls it.
func (t *Tracker) update(f func()) {
	t.mu.Lock()
	before, marksBefore := t.statesLocked(), t.marksLocked()
	f()
	after, marks := t.statesLocked(), t.marksLocked()
	changed := !slices.Equal(before, after)
	if changed {
		for ch := range t.subs {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	t.mu.Unlock()
	if !maps.Equal(marksBefore, marks) {
		t.save(marks)
	}
	if changed {
		for i, s := range after {
			if s.Healthy != before[i].Healthy {
				t.log.Info("GPU health changed", "uuid", s.UUID, "healthy", s.Healthy, "reason", s.Reason)
			}
		}
		t.onChange(after)
	}
}

// scheduleLocked arms d's recheck after the quiet period, replacing any
// earlier one.
func (t *Tracker) scheduleLocked(d *device) { t.scheduleAfterLocked(d, t.quiet) }

// scheduleAfterLocked arms d's recheck after wait; none when the quiet
// period is 0 (operator action only).
func (t *Tracker) scheduleAfterLocked(d *device, wait time.Duration) {
	d.gen++
	d.checkDue = false
	if d.recheck != nil {
		d.recheck.Stop()
	}
	if t.quiet <= 0 {
		return
	}
	gen := d.gen
	d.recheck = time.AfterFunc(wait, func() {
		t.mu.Lock()
		if d.gen == gen {
			d.checkDue = true
		}
		t.mu.Unlock()
		select {
		case t.wake <- struct{}{}:
		default:
		}
	})
}

// ErrUnknownGPU is returned by Recover for a GPU that is not tracked.
var ErrUnknownGPU = errors.New("GPU is not published by this plugin")

// ErrNotRunning is returned by Recover when health monitoring has ended.
var ErrNotRunning = errors.New("health monitoring is not running")

// Recover asks NVML about the GPU and, if it answers healthy, clears its
// Xid and lost marks (operator action). It returns why not otherwise.
func (t *Tracker) Recover(ctx context.Context, uuid string) error {
	if _, ok := t.devs[uuid]; !ok {
		return fmt.Errorf("recover %s: %w", uuid, ErrUnknownGPU)
	}
	return t.ask(ctx, uuid)
}

// RecoverAll is Recover for every GPU; it returns the GPUs NVML does not
// vouch for.
func (t *Tracker) RecoverAll(ctx context.Context) error { return t.ask(ctx, "") }

func (t *Tracker) ask(ctx context.Context, uuid string) error {
	r := request{uuid: uuid, resp: make(chan error, 1)}
	select {
	case t.reqs <- r:
	case <-t.done:
		return ErrNotRunning
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.resp:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
