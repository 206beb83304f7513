package fswatch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

var quiet = WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))

// noInotify makes setting up inotify fail, as when the inotify instance
// limit is reached.
func noInotify(c *config) {
	c.notifier = func() (*fsnotify.Watcher, error) { return nil, errors.New("too many open files") }
}

// modes are the ways a Watcher can see changes; each must see the same.
var modes = []struct {
	name string
	opts []Option
}{
	{"inotify", nil},
	{"poll only", []Option{PollOnly()}},
	{"inotify unavailable", []Option{noInotify}},
}

// seen accumulates the Changes a Watcher delivers.
type seen struct {
	paths  map[string]bool
	rescan bool
}

// await reads changes until cond holds or 5 s pass.
func await(t *testing.T, w *Watcher, s *seen, what string, cond func(*seen) bool) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for !cond(s) {
		select {
		case c := <-w.Changes():
			if !slices.IsSorted(c.Paths) || (len(c.Paths) == 0 && !c.Rescan) {
				t.Fatalf("malformed change %+v", c)
			}
			for _, p := range c.Paths {
				s.paths[p] = true
			}
			s.rescan = s.rescan || c.Rescan
		case <-timeout:
			t.Fatalf("%s: not seen within 5s (seen %v, rescan %v)", what, s.paths, s.rescan)
		}
	}
	s.paths, s.rescan = map[string]bool{}, false
}

func has(p string) func(*seen) bool      { return func(s *seen) bool { return s.paths[p] } }
func rescanned(s *seen) bool             { return s.rescan }
func write(t *testing.T, p, data string) { t.Helper(); must(t, os.WriteFile(p, []byte(data), 0o644)) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestReportsChanges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		present bool // the directory exists before Start
		steps   func(t *testing.T, dir string, w *Watcher, s *seen)
	}{
		{"file created, written and removed", true, func(t *testing.T, dir string, w *Watcher, s *seen) {
			f := filepath.Join(dir, "a.yaml")
			write(t, f, "1")
			await(t, w, s, "created", has(f))
			write(t, f, "22")
			await(t, w, s, "written", has(f))
			must(t, os.Remove(f))
			await(t, w, s, "removed", has(f))
		}},
		{"dir created after start", false, func(t *testing.T, dir string, w *Watcher, s *seen) {
			must(t, os.Mkdir(dir, 0o755))
			await(t, w, s, "dir created", rescanned)
			f := filepath.Join(dir, "a.yaml")
			write(t, f, "1")
			await(t, w, s, "file in the new dir", has(f))
		}},
		{"file replaced by rename", true, func(t *testing.T, dir string, w *Watcher, s *seen) {
			f, tmp := filepath.Join(dir, "a.yaml"), filepath.Join(dir, ".a.tmp")
			write(t, f, "old")
			await(t, w, s, "created", has(f))
			write(t, tmp, "new")
			must(t, os.Rename(tmp, f))
			await(t, w, s, "replaced", has(f))
		}},
		{"dir deleted and recreated", true, func(t *testing.T, dir string, w *Watcher, s *seen) {
			write(t, filepath.Join(dir, "a.yaml"), "1")
			await(t, w, s, "created", has(filepath.Join(dir, "a.yaml")))
			must(t, os.RemoveAll(dir))
			await(t, w, s, "dir deleted", rescanned)
			must(t, os.Mkdir(dir, 0o755))
			await(t, w, s, "dir recreated", rescanned)
			f := filepath.Join(dir, "b.yaml")
			write(t, f, "1")
			await(t, w, s, "file in the recreated dir", has(f))
		}},
		{"dir moved away and back", true, func(t *testing.T, dir string, w *Watcher, s *seen) {
			away := dir + ".away"
			must(t, os.Rename(dir, away))
			await(t, w, s, "dir moved away", rescanned)
			// Nothing inside the moved directory is reported as the watched one's.
			write(t, filepath.Join(away, "x.yaml"), "1")
			must(t, os.Rename(away, dir))
			await(t, w, s, "dir back", rescanned)
			f := filepath.Join(dir, "b.yaml")
			write(t, f, "1")
			await(t, w, s, "file in the dir moved back", has(f))
		}},
	} {
		for _, m := range modes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				dir := filepath.Join(t.TempDir(), "d")
				if tc.present {
					must(t, os.Mkdir(dir, 0o755))
				}
				w, err := Start(context.Background(), []string{dir}, append([]Option{quiet, WithPoll(5 * time.Millisecond)}, m.opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				tc.steps(t, dir, w, &seen{paths: map[string]bool{}})
			})
		}
	}
}

// Only kept paths are reported; a rescan is reported whatever the filter.
func TestFilter(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "kubelet.sock")
			w, err := Start(context.Background(), []string{dir}, append([]Option{quiet, WithPoll(5 * time.Millisecond),
				WithFilter(func(p string) bool { return p == sock })}, m.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			write(t, filepath.Join(dir, "other.sock"), "")
			write(t, sock, "")
			s := &seen{paths: map[string]bool{}}
			await(t, w, s, "kept path", func(s *seen) bool {
				if s.paths[filepath.Join(dir, "other.sock")] {
					t.Fatal("a filtered-out path was reported")
				}
				return s.paths[sock]
			})
		})
	}
}

// A burst of writes within the debounce arrives as one Change, no sooner
// than the debounce after the first.
func TestDebounceCoalesces(t *testing.T) {
	dir := t.TempDir()
	const debounce = 100 * time.Millisecond
	w, err := Start(context.Background(), []string{dir}, quiet, WithDebounce(debounce))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	t0 := time.Now()
	want := []string{filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")}
	for _, p := range want {
		write(t, p, "1")
	}
	select {
	case c := <-w.Changes():
		if took := time.Since(t0); took < debounce {
			t.Errorf("change delivered after %s, before the %s debounce", took, debounce)
		}
		if !slices.Equal(c.Paths, want) {
			t.Errorf("first change %v, want the whole burst %v", c.Paths, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no change within 5s")
	}
}

// A Watcher that could not set up inotify polls, tries again on each poll
// and stops polling once inotify works.
func TestInotifySetUpLater(t *testing.T) {
	dir := t.TempDir()
	var calls atomic.Int32
	later := func(c *config) {
		c.notifier = func() (*fsnotify.Watcher, error) {
			if calls.Add(1) == 1 {
				return nil, errors.New("too many open files")
			}
			return fsnotify.NewWatcher()
		}
	}
	w, err := Start(context.Background(), []string{dir}, quiet, WithPoll(5*time.Millisecond), later)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	deadline := time.Now().Add(5 * time.Second)
	for calls.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("inotify not tried again")
		}
		time.Sleep(time.Millisecond)
	}
	f := filepath.Join(dir, "a")
	write(t, f, "1")
	await(t, w, &seen{paths: map[string]bool{}}, "change once inotify works", has(f))
	time.Sleep(50 * time.Millisecond)
	if n := calls.Load(); n != 2 {
		t.Errorf("inotify set up %d times; once it works the directory is watched, not polled", n)
	}
}

// When its context ends a Watcher's goroutines end, whether or not Close
// is called, and Close then returns at once.
func TestContextEndLeavesNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	var ws []*Watcher
	for _, m := range modes {
		w, err := Start(ctx, []string{t.TempDir(), filepath.Join(t.TempDir(), "absent")}, append([]Option{quiet, WithPoll(time.Millisecond)}, m.opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	if n := runtime.NumGoroutine(); n <= before {
		t.Fatalf("%d goroutines with three watchers running, %d before: the count cannot show a leak", n, before)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines left after the context ended, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
	for _, w := range ws {
		done := make(chan struct{})
		go func() { w.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Fatal("Close blocked after the context ended")
		}
	}
}

func TestStartRefuses(t *testing.T) {
	if _, err := Start(context.Background(), nil); err == nil {
		t.Error("Start with no directories succeeded")
	}
	if _, err := Start(context.Background(), []string{t.TempDir()}, WithPoll(0)); err == nil {
		t.Error("Start with a zero poll interval succeeded")
	}
}
