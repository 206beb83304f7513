// Package coalesce limits how often a consumer is told about a changing
// state: it takes each newest full state and delivers at most one per
// interval, the newest winning.
//
// The bound: deliveries start at least one interval apart, so a consumer
// gets at most one update per interval (per node, so per GPU at most
// 1/interval, however fast a GPU flaps), plus the final state. The final
// state is never lost: an update that arrives during the quiet time after
// a delivery is delivered when it ends, unless a newer one replaced it.
// The first change after a quiet time goes out at once, so a single
// change waits for nothing. A state equal to the last delivered one is
// not delivered.
package coalesce

import (
	"context"
	"sync"
	"time"
)

// Limiter coalesces states of type S for one consumer.
type Limiter[S any] struct {
	interval  time.Duration
	equal     func(a, b S) bool
	deliver   func(S)
	coalesced func()

	mu      sync.Mutex
	pending S
	has     bool
	wake    chan struct{}

	// last is the state the consumer holds; only Run touches it.
	last S
}

// Option configures a Limiter.
type Option func(*options)

type options struct{ coalesced func() }

// WithOnCoalesced is called for each update a newer one replaced before
// it was delivered (a metric counts them).
func WithOnCoalesced(f func()) Option { return func(o *options) { o.coalesced = f } }

// New returns a limiter that calls deliver, from Run's goroutine, at most
// once per interval (0: each update at once, the newest winning while
// deliver runs). last is the state the consumer holds already; equal tells
// two states apart.
func New[S any](interval time.Duration, last S, equal func(a, b S) bool, deliver func(S), opts ...Option) *Limiter[S] {
	o := options{coalesced: func() {}}
	for _, f := range opts {
		f(&o)
	}
	return &Limiter[S]{interval: interval, equal: equal, deliver: deliver, coalesced: o.coalesced, last: last, wake: make(chan struct{}, 1)}
}

// Update hands over the newest state; it never blocks.
func (l *Limiter[S]) Update(s S) {
	l.mu.Lock()
	if l.has {
		l.coalesced()
	}
	l.pending, l.has = s, true
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// Run delivers until ctx ends, and returns once no delivery runs. A state
// still waiting for its quiet time when ctx ends is not delivered: the
// consumer ends too.
func (l *Limiter[S]) Run(ctx context.Context) {
	var (
		sent  time.Time // when the last delivery started; zero: none yet
		timer *time.Timer
		due   <-chan time.Time
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-due:
			due = nil
		case <-l.wake:
			if due != nil {
				// Delivered when the quiet time ends.
				continue
			}
			if wait := l.interval - time.Since(sent); !sent.IsZero() && wait > 0 {
				timer = time.NewTimer(wait)
				due = timer.C
				continue
			}
		}
		s, ok := l.take()
		if !ok || l.equal(s, l.last) {
			continue
		}
		sent = time.Now()
		l.deliver(s)
		l.last = s
	}
}

// take removes the pending state, if any.
func (l *Limiter[S]) take() (S, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.pending, l.has
	var zero S
	l.pending, l.has = zero, false
	return s, ok
}
