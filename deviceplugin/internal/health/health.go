// Package health keeps each published GPU's health from NVML Xid and
// GPU-lost events and applies the recovery policy:
//
//   - An Xid in the ignored list (application errors) changes nothing.
//   - Any other Xid makes the GPU Unhealthy; it turns Healthy again once no
//     further such Xid arrived for the quiet period (0: never by itself).
//   - A lost GPU stays Unhealthy until operator action (Recover/RecoverAll,
//     which the daemon wires to SIGHUP), since a lost GPU sends no more events.
//   - While health monitoring is not running (it failed, or has not proven
//     itself for the start grace yet) every GPU is Unhealthy: fail closed.
//
// The state lives as long as the process, so re-registering with a
// restarted kubelet keeps it.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nvinject/nvinject/shared/gpu"
)

// Watcher streams health events; gpu.Inventory satisfies it.
type Watcher interface {
	WatchHealth(ctx context.Context, uuids []string, events chan<- gpu.HealthEvent) error
}

// State is one GPU's health as published.
type State struct {
	UUID    string
	Healthy bool
	// Reason says why the GPU is Unhealthy; empty when Healthy.
	Reason string
}

// Tracker holds the GPUs' health and notifies subscribers on change.
type Tracker struct {
	log         *slog.Logger
	ignored     map[uint64]bool
	quiet       time.Duration
	grace       time.Duration
	retryMin    time.Duration
	retryMax    time.Duration
	observe     func(e gpu.HealthEvent, ignored bool)
	onChange    func([]State)
	order       []string
	mu          sync.Mutex
	devs        map[string]*device
	subs        map[chan struct{}]struct{}
	monitorDown string
}

type device struct {
	xid     uint64
	xidAt   time.Time
	xidGen  uint64
	xidTime *time.Timer
	lost    bool
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

// WithQuietPeriod sets how long after its last Xid a GPU turns Healthy
// again; 0 keeps it Unhealthy until Recover.
func WithQuietPeriod(d time.Duration) Option { return func(t *Tracker) { t.quiet = d } }

// WithStartGrace sets how long a health watch must run before its GPUs
// count as monitored.
func WithStartGrace(d time.Duration) Option { return func(t *Tracker) { t.grace = d } }

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

// New tracks uuids. Until Run has watched them for the start grace they
// are Unhealthy.
func New(uuids []string, opts ...Option) *Tracker {
	t := &Tracker{
		log: slog.Default(), quiet: 5 * time.Minute, grace: 500 * time.Millisecond,
		retryMin: time.Second, retryMax: time.Minute,
		observe: func(gpu.HealthEvent, bool) {}, onChange: func([]State) {},
		order: slices.Clone(uuids), devs: map[string]*device{}, subs: map[chan struct{}]struct{}{},
		monitorDown: "health monitoring has not started yet",
	}
	for _, o := range opts {
		o(t)
	}
	for _, u := range uuids {
		t.devs[u] = &device{}
	}
	return t
}

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
	switch {
	case d.lost:
		return "GPU lost (fell off the bus or stopped answering); send SIGHUP after fixing it"
	case !d.xidAt.IsZero():
		return fmt.Sprintf("Xid %d at %s", d.xid, d.xidAt.Format(time.RFC3339))
	case t.monitorDown != "":
		return t.monitorDown
	}
	return ""
}

// Healthy reports whether the GPU with uuid is tracked and Healthy.
func (t *Tracker) Healthy(uuid string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	d, ok := t.devs[uuid]
	return ok && t.reasonLocked(d) == ""
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

// update runs f under the lock and, when the published states changed,
// notifies subscribers.
func (t *Tracker) update(f func()) {
	t.mu.Lock()
	before := t.statesLocked()
	f()
	after := t.statesLocked()
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
	if changed {
		for i, s := range after {
			if s.Healthy != before[i].Healthy {
				t.log.Info("GPU health changed", "uuid", s.UUID, "healthy", s.Healthy, "reason", s.Reason)
			}
		}
		t.onChange(after)
	}
}

// Handle applies one health event.
func (t *Tracker) Handle(e gpu.HealthEvent) {
	ignored := e.Kind == gpu.EventXid && t.ignored[e.Xid]
	defer t.observe(e, ignored)
	if ignored {
		t.log.Info("ignoring application Xid", "uuid", e.UUID, "xid", e.Xid)
		return
	}
	t.update(func() {
		d, ok := t.devs[e.UUID]
		if !ok {
			return
		}
		switch e.Kind {
		case gpu.EventLost:
			d.lost = true
		case gpu.EventXid:
			d.xid, d.xidAt = e.Xid, e.Time
			if d.xidAt.IsZero() {
				d.xidAt = time.Now()
			}
			d.xidGen++
			if d.xidTime != nil {
				d.xidTime.Stop()
			}
			if t.quiet > 0 {
				gen, uuid := d.xidGen, e.UUID
				d.xidTime = time.AfterFunc(t.quiet, func() { t.quietEnded(uuid, gen) })
			}
		}
	})
}

func (t *Tracker) quietEnded(uuid string, gen uint64) {
	t.update(func() {
		if d := t.devs[uuid]; d.xidGen == gen {
			d.xidAt = time.Time{}
		}
	})
}

// ErrUnknownGPU is returned by Recover for a GPU that is not tracked.
var ErrUnknownGPU = errors.New("GPU is not published by this plugin")

// Recover clears the Xid and lost marks of one GPU (operator action).
func (t *Tracker) Recover(uuid string) error {
	t.mu.Lock()
	_, ok := t.devs[uuid]
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("recover %s: %w", uuid, ErrUnknownGPU)
	}
	t.update(func() { t.devs[uuid].clear() })
	return nil
}

// RecoverAll clears the Xid and lost marks of every GPU (operator action).
func (t *Tracker) RecoverAll() {
	t.update(func() {
		for _, d := range t.devs {
			d.clear()
		}
	})
}

func (d *device) clear() {
	d.lost, d.xidAt = false, time.Time{}
	d.xidGen++
	if d.xidTime != nil {
		d.xidTime.Stop()
	}
}

// Run watches the GPUs until ctx ends, restarting a failed watch with
// backoff. While no watch has run for the start grace, every GPU is
// Unhealthy and the reason says why.
func (t *Tracker) Run(ctx context.Context, w Watcher) {
	backoff := t.retryMin
	for ctx.Err() == nil {
		err := t.watchOnce(ctx, w, func() { backoff = t.retryMin })
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("the health watch ended without an error")
		}
		reason := fmt.Sprintf("health monitoring failed (%v); retrying", err)
		t.update(func() { t.monitorDown = reason })
		t.log.Error("health monitoring failed: every GPU is Unhealthy until it works again", "err", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, t.retryMax)
	}
}

func (t *Tracker) watchOnce(ctx context.Context, w Watcher, stable func()) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan gpu.HealthEvent, 64)
	errc := make(chan error, 1)
	go func() { errc <- w.WatchHealth(wctx, slices.Clone(t.order), events) }()
	grace := time.NewTimer(t.grace)
	defer grace.Stop()
	for {
		select {
		case e := <-events:
			t.Handle(e)
		case <-grace.C:
			t.update(func() { t.monitorDown = "" })
			stable()
		case err := <-errc:
			return err
		}
	}
}
