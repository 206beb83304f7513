package health

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/nvinject/nvinject/gpunode/health/coalesce"
)

// Reported is a tracker's health as the plugins report it to the API
// server (kubelet's device list, which becomes Node status; the
// ResourceSlice taints): the tracker's states, each change passed through
// a coalesce.Limiter, so a flapping GPU costs at most one report per
// interval plus the final one. What refuses a GPU (Allocate, prepare)
// reads the tracker itself, which is never late.
type Reported struct {
	t        *Tracker
	interval time.Duration
	opts     []coalesce.Option

	mu        sync.Mutex
	states    []State
	subs      map[chan struct{}]struct{}
	monitored chan struct{}
}

// NewReported reports t's health, at most one change per interval (0:
// every change); opts reach the limiter (coalesce.WithOnCoalesced).
func NewReported(t *Tracker, interval time.Duration, opts ...coalesce.Option) *Reported {
	return &Reported{t: t, interval: interval, opts: opts, states: t.States(), subs: map[chan struct{}]struct{}{}, monitored: make(chan struct{})}
}

// Monitored is closed once the reported states are the tracker's first
// true ones (Tracker.Monitored), so a first report waiting on it is true.
func (r *Reported) Monitored() <-chan struct{} { return r.monitored }

// States returns every GPU's reported health in publication order.
func (r *Reported) States() []State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.states)
}

// Healthy reports whether the GPU with uuid is reported Healthy.
func (r *Reported) Healthy(uuid string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := slices.IndexFunc(r.states, func(s State) bool { return s.UUID == uuid })
	return i >= 0 && r.states[i].Healthy
}

// Subscribe is Tracker.Subscribe for the reported states.
func (r *Reported) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	r.mu.Lock()
	r.subs[ch] = struct{}{}
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		delete(r.subs, ch)
		r.mu.Unlock()
	}
}

// Run follows the tracker until ctx ends and returns once its limiter
// did. Until the tracker is monitored the states stay its first ones
// (every GPU Unhealthy); the first monitored states are reported at once.
func (r *Reported) Run(ctx context.Context) {
	changed, cancel := r.t.Subscribe()
	defer cancel()
	select {
	case <-r.t.Monitored():
	case <-ctx.Done():
		return
	}
	r.set(r.t.States())
	close(r.monitored)
	lim := coalesce.New(r.interval, r.States(), slices.Equal[[]State], r.set, r.opts...)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { lim.Run(ctx) })
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			lim.Update(r.t.States())
		}
	}
}

// set makes states the reported ones and notifies subscribers.
func (r *Reported) set(states []State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.states = states
	for ch := range r.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
