package nodemove

import (
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/nvinject/nvinject/shared/logging"
)

// errNotRead is the state before the first poll: nothing is known yet.
var errNotRead = errors.New("kubelet's PodResources not read yet")

// Set is the GPUs a daemon withholds now: those the other path's running
// pods hold, and every GPU while kubelet's PodResources cannot be read.
// The device plugin publishes them Unhealthy, so kubelet's allocatable
// leaves them out (kubelet's device manager does not know DRA's
// allocations); nvinject-dra taints them, so no claim is given them.
type Set struct {
	src      Source
	uuids    []string
	log      *slog.Logger
	onChange func(uuids []string, r Result)

	mu       sync.Mutex
	cur      Result
	subs     map[chan struct{}]struct{}
	read     chan struct{}
	readOnce sync.Once
}

// NewSet returns the set of the published GPUs uuids that src's pods may
// hold; until the first Update every one is withheld. onChange, if not
// nil, is called with uuids and the state now and after each change (the
// metrics, the taints).
func NewSet(src Source, uuids []string, log *slog.Logger, onChange func(uuids []string, r Result)) *Set {
	if onChange == nil {
		onChange = func([]string, Result) {}
	}
	s := &Set{src: src, uuids: uuids, log: log, onChange: onChange, cur: Result{Err: errNotRead}, subs: map[chan struct{}]struct{}{}, read: make(chan struct{})}
	s.onChange(s.uuids, s.cur)
	return s
}

// Read is closed once the first Update came: kubelet was asked.
func (s *Set) Read() <-chan struct{} { return s.read }

// Update records a poll, logs what changed and notifies subscribers.
func (s *Set) Update(r Result) {
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
	s.readOnce.Do(func() { close(s.read) })
}

func (s *Set) logChange(prev, r Result) {
	switch {
	case r.Err != nil:
		s.log.Error("GPUs held by "+s.src.holders+" unknown: every GPU is "+s.src.withhold+" until kubelet's PodResources can be read (fail closed)", logging.Err(r.Err))
		return
	case prev.Err != nil && !errors.Is(prev.Err, errNotRead):
		s.log.Info("kubelet's PodResources readable again; only GPUs " + s.src.holders + " hold stay " + s.src.withhold)
	}
	for _, u := range s.uuids {
		was, now := prev.Holders[u], r.Holders[u]
		switch {
		case len(now) > 0 && !slices.Equal(was, now):
			s.log.Info("GPU held by "+s.src.one+": "+s.src.withhold+" until its pod ends", "uuid", u, "holders", Strings(now))
		case len(now) == 0 && len(was) > 0:
			s.log.Info("GPU no longer held by "+s.src.one+": its own health decides again", "uuid", u)
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
		return "held through " + s.src.via + " by " + strings.Join(Strings(hs), ", "), true
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
