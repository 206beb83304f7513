// Package fswatch tells its owner which files in a set of directories
// changed: through inotify (fsnotify) where it can, and by listing each
// directory it cannot watch (missing, inotify's limits reached, no inotify
// at all) every poll interval until it can watch it.
package fswatch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Change is what changed since the previous Change.
type Change struct {
	// Paths are the files inside the watched directories that were
	// created, written, removed or renamed or changed mode, sorted.
	Paths []string
	// Rescan is set when changes may have gone unreported: a watched
	// directory appeared, went away or was moved, or inotify overflowed.
	// Look at everything.
	Rescan bool
}

// DefaultPoll is how often a directory that cannot be watched is listed.
const DefaultPoll = 100 * time.Millisecond

type config struct {
	poll     time.Duration
	debounce time.Duration
	keep     func(path string) bool
	pollOnly bool
	log      *slog.Logger
	// notifier makes the inotify watcher; tests make it fail.
	notifier func() (*fsnotify.Watcher, error)
}

// Option configures a Watcher.
type Option func(*config)

// WithPoll sets how often a directory that is not watched is listed
// (default DefaultPoll).
func WithPoll(d time.Duration) Option { return func(c *config) { c.poll = d } }

// WithDebounce holds a Change for d after its first path, so that a burst
// of writes arrives as one (default 0: at once).
func WithDebounce(d time.Duration) Option { return func(c *config) { c.debounce = d } }

// WithFilter reports only the paths keep accepts. A Rescan is reported
// whatever the filter.
func WithFilter(keep func(path string) bool) Option { return func(c *config) { c.keep = keep } }

// PollOnly leaves inotify out: every directory is polled, as on a node
// where inotify cannot be set up.
func PollOnly() Option { return func(c *config) { c.pollOnly = true } }

// WithLogger sets where a directory falling back to polling is reported.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// Watcher reports changes in its directories on Changes until its context
// ends or Close.
type Watcher struct {
	out    chan Change
	cancel context.CancelFunc
	done   chan struct{}
}

// Start watches dirs until ctx ends or Close. What is in them when Start
// returns is not reported; a change after that is.
func Start(ctx context.Context, dirs []string, opts ...Option) (*Watcher, error) {
	c := config{poll: DefaultPoll, keep: func(string) bool { return true }, log: slog.Default(), notifier: fsnotify.NewWatcher}
	for _, o := range opts {
		o(&c)
	}
	if len(dirs) == 0 {
		return nil, errors.New("fswatch: no directories to watch")
	}
	if c.poll <= 0 {
		return nil, fmt.Errorf("fswatch: poll interval %s: want a positive duration", c.poll)
	}
	l := &loop{config: c, dirs: map[string]bool{}, polled: map[string]listing{}, reported: map[string]string{}, paths: map[string]bool{}}
	for _, d := range dirs {
		l.dirs[filepath.Clean(d)] = true
	}
	if !c.pollOnly {
		l.newNotifier()
	}
	for d := range l.dirs {
		// Watched, or polled from what is there now.
		if !l.add(d) {
			l.polled[d] = list(d)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &Watcher{out: make(chan Change), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		l.run(ctx, w.out)
	}()
	return w, nil
}

// Changes delivers each Change once; it is not closed.
func (w *Watcher) Changes() <-chan Change { return w.out }

// Close stops the watch and waits for it to end.
func (w *Watcher) Close() {
	w.cancel()
	<-w.done
}

// loop is the state of a Watcher's one goroutine.
type loop struct {
	config
	dirs map[string]bool
	n    *fsnotify.Watcher // nil while inotify is unavailable
	// polled holds the directories n does not watch, as last listed.
	polled map[string]listing
	// reported is the last error logged per directory, to log each once.
	reported map[string]string
	// The Change being collected.
	paths   map[string]bool
	rescan  bool
	pending bool
	ready   bool
	due     <-chan time.Time
}

func (l *loop) run(ctx context.Context, out chan<- Change) {
	defer func() {
		if l.n != nil {
			_ = l.n.Close()
		}
	}()
	tick := time.NewTicker(l.poll)
	defer tick.Stop()
	for {
		var (
			events <-chan fsnotify.Event
			errs   <-chan error
			poll   <-chan time.Time
			send   chan<- Change
			c      Change
		)
		if l.n != nil {
			events, errs = l.n.Events, l.n.Errors
		}
		if len(l.polled) > 0 {
			poll = tick.C
		}
		if l.ready {
			send, c = out, Change{Paths: slices.Sorted(maps.Keys(l.paths)), Rescan: l.rescan}
		}
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				l.lostNotifier()
				continue
			}
			l.event(ev)
		case err, ok := <-errs:
			if !ok {
				l.lostNotifier()
				continue
			}
			// An overflow loses events; any other error may too.
			l.log.Warn("directory watch error; looking at everything again", "error", err.Error())
			l.rescan = true
			l.changed()
		case <-poll:
			l.pollAll()
		case <-l.due:
			l.due, l.ready = nil, true
		case send <- c:
			clear(l.paths)
			l.rescan, l.pending, l.ready = false, false, false
		}
	}
}

// changed notes that the Change being collected is not empty.
func (l *loop) changed() {
	if l.pending {
		return
	}
	l.pending = true
	if l.debounce <= 0 {
		l.ready = true
		return
	}
	l.due = time.After(l.debounce)
}

func (l *loop) path(p string) {
	if l.keep(p) {
		l.paths[p] = true
		l.changed()
	}
}

func (l *loop) event(ev fsnotify.Event) {
	name := filepath.Clean(ev.Name)
	if l.dirs[name] {
		_, polled := l.polled[name]
		switch {
		case !polled && ev.Has(fsnotify.Remove|fsnotify.Rename):
			// The watch went with the directory: poll for the next one.
			_ = l.n.Remove(name)
			l.polled[name] = list(name)
			l.rescan = true
			l.changed()
		case polled && ev.Has(fsnotify.Create):
			// Created inside another watched directory: watch it now.
			l.upgrade(name)
		}
	}
	if l.dirs[filepath.Dir(name)] {
		l.path(name)
	}
}

// newNotifier sets up inotify, reporting why it cannot.
func (l *loop) newNotifier() {
	n, err := l.notifier()
	if err != nil {
		l.report("", err)
		return
	}
	if _, ok := l.reported[""]; ok {
		l.log.Info("inotify set up again; watching directories")
		delete(l.reported, "")
	}
	l.n = n
}

// lostNotifier polls every directory after inotify's channels closed.
func (l *loop) lostNotifier() {
	_ = l.n.Close()
	l.n = nil
	for d := range l.dirs {
		if _, ok := l.polled[d]; !ok {
			l.polled[d] = list(d)
		}
	}
	l.rescan = true
	l.changed()
}

// add watches dir with inotify, reporting why it cannot.
func (l *loop) add(dir string) bool {
	if l.n == nil {
		return false
	}
	if err := l.n.Add(dir); err != nil {
		l.report(dir, err)
		return false
	}
	if _, ok := l.reported[dir]; ok {
		l.log.Info("watching directory again", "dir", dir)
		delete(l.reported, dir)
	}
	return true
}

// upgrade tries to watch a polled dir; what changed before the watch took
// comes from a listing made after it.
func (l *loop) upgrade(dir string) bool {
	if !l.add(dir) {
		return false
	}
	l.diff(dir, l.polled[dir], list(dir))
	delete(l.polled, dir)
	return true
}

func (l *loop) pollAll() {
	if l.n == nil && !l.pollOnly {
		l.newNotifier()
	}
	for dir, old := range l.polled {
		cur := list(dir)
		if cur.ok && l.upgrade(dir) {
			continue
		}
		l.diff(dir, old, cur)
		l.polled[dir] = cur
	}
}

// diff reports what differs between two listings of dir.
func (l *loop) diff(dir string, old, cur listing) {
	if old.ok != cur.ok {
		l.rescan = true
		l.changed()
	}
	for name, e := range cur.files {
		if o, ok := old.files[name]; !ok || o != e {
			l.path(filepath.Join(dir, name))
		}
	}
	for name := range old.files {
		if _, ok := cur.files[name]; !ok {
			l.path(filepath.Join(dir, name))
		}
	}
}

// report logs once per directory and error why it is polled; dir "" is
// inotify as a whole.
func (l *loop) report(dir string, err error) {
	if l.reported[dir] == err.Error() {
		return
	}
	l.reported[dir] = err.Error()
	switch {
	case dir == "":
		l.log.Warn("cannot set up inotify; polling every directory instead", "error", err.Error(), "poll", l.poll.String())
	case errors.Is(err, fs.ErrNotExist):
		l.log.Info("directory absent; polling until it appears", "dir", dir, "poll", l.poll.String())
	default:
		l.log.Warn("cannot watch directory; polling it instead", "dir", dir, "error", err.Error(), "poll", l.poll.String())
	}
}

// listing is a directory's files as polled; ok is false while the
// directory cannot be read.
type listing struct {
	ok    bool
	files map[string]entry
}

// entry tells a changed or replaced file from the one listed before.
type entry struct {
	ino   uint64
	size  int64
	mtime int64
	mode  fs.FileMode
}

func list(dir string) listing {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return listing{}
	}
	l := listing{ok: true, files: make(map[string]entry, len(ents))}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			// Gone since the listing: the next one reports it.
			continue
		}
		en := entry{size: fi.Size(), mtime: fi.ModTime().UnixNano(), mode: fi.Mode()}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			en.ino = st.Ino
		}
		l.files[e.Name()] = en
	}
	return l
}
