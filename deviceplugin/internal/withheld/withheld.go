// Package withheld keeps the GPUs the device plugin must not hand out: those
// a DRA claim of a running pod holds (the node moved back from DRA under
// it; kubelet's device manager does not know DRA's allocations), and every
// GPU while kubelet's PodResources cannot be read (fail closed). The plugin
// publishes them Unhealthy, so kubelet's allocatable leaves them out, until
// the holder ends.
package withheld

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/nvinject/nvinject/deviceplugin/internal/podheld"
	"github.com/nvinject/nvinject/shared/logging"
)

// errNotRead is the state before the first poll: nothing is known yet.
var errNotRead = errors.New("kubelet's PodResources not read yet")

// Set is the GPUs withheld now.
type Set struct {
	uuids    []string
	log      *slog.Logger
	onChange func(uuids []string, r podheld.Result)

	mu   sync.Mutex
	cur  podheld.Result
	subs map[chan struct{}]struct{}
}

// Option configures a Set.
type Option func(*Set)

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(s *Set) { s.log = l } }

// WithOnChange is called after each change with the published GPUs and
// the new state (the metrics).
func WithOnChange(f func(uuids []string, r podheld.Result)) Option {
	return func(s *Set) { s.onChange = f }
}

// New returns the set for the published GPUs uuids; until the first Update
// every one is withheld.
func New(uuids []string, opts ...Option) *Set {
	s := &Set{uuids: uuids, log: slog.Default(), onChange: func([]string, podheld.Result) {}, cur: podheld.Result{Err: errNotRead}, subs: map[chan struct{}]struct{}{}}
	for _, o := range opts {
		o(s)
	}
	s.onChange(s.uuids, s.cur)
	return s
}

// Update records a poll, logs what changed and notifies subscribers.
func (s *Set) Update(r podheld.Result) {
	s.mu.Lock()
	prev := s.cur
	s.cur = r
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	s.mu.Unlock()
	s.logChange(prev, r)
	s.onChange(s.uuids, r)
}

func (s *Set) logChange(prev, r podheld.Result) {
	switch {
	case r.Err != nil:
		s.log.Error("GPUs held by DRA claims unknown: every GPU is published Unhealthy until kubelet's PodResources can be read (fail closed)", logging.Err(r.Err))
		return
	case prev.Err != nil && !errors.Is(prev.Err, errNotRead):
		s.log.Info("kubelet's PodResources readable again; only GPUs DRA claims hold stay withheld")
	}
	for _, u := range s.uuids {
		was, now := prev.Holders[u], r.Holders[u]
		switch {
		case len(now) > 0 && !slices.Equal(was, now):
			s.log.Info("GPU held by a DRA claim: published Unhealthy, so kubelet gives it to no device-plugin pod, until the claim's pod ends", "uuid", u, "holders", podheld.Strings(now))
		case len(now) == 0 && len(was) > 0:
			s.log.Info("GPU no longer held by a DRA claim: published by its health again", "uuid", u)
		}
	}
}

// Withheld says why the GPU with uuid must not be handed out, if it must.
func (s *Set) Withheld(uuid string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur.Err != nil {
		return s.cur.Err.Error(), true
	}
	if hs := s.cur.Holders[uuid]; len(hs) > 0 {
		return "held through DRA by " + strings.Join(podheld.Strings(hs), ", "), true
	}
	return "", false
}

// Err is why PodResources cannot be read, nil when the last poll read it.
func (s *Set) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.Err
}

// Subscribe returns a channel that receives a value after each Update; a
// subscriber that does not read misses only intermediate states. Call
// cancel when done.
func (s *Set) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.subs, ch)
		s.mu.Unlock()
	}
}
