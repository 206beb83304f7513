// Package resolve turns qualified CDI device names into the OCI edits they
// stand for. It reads the spec directories into a snapshot (a CDI cache that
// never refreshes itself) and replaces the whole snapshot when files change:
// a reload runs off the hot path, coalescing a burst of file events, and
// Resolve always reads the latest complete snapshot without waiting for one.
package resolve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/shared/contract"
)

// DefaultDebounce is how long a reload waits after the first file event, so
// that a burst of writes costs one reload.
const DefaultDebounce = 50 * time.Millisecond

// Resolver resolves CDI names against a set of spec directories.
type Resolver struct {
	dirs     []string
	debounce time.Duration
	log      *slog.Logger
	current  atomic.Pointer[snapshot]
	reloads  atomic.Int64
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// snapshot is the spec directories as read at one moment.
type snapshot struct {
	cache  *cdi.Cache
	errors []string
}

// Option configures a Resolver.
type Option func(*Resolver)

// WithDebounce sets how long a reload waits after the first file event
// (default DefaultDebounce). A directory change shows in Resolve within
// about this long plus one reload.
func WithDebounce(d time.Duration) Option { return func(r *Resolver) { r.debounce = d } }

// WithLogger sets where reload failures are reported.
func WithLogger(l *slog.Logger) Option { return func(r *Resolver) { r.log = l } }

// UnresolvableError lists the names no spec in Dirs defines.
type UnresolvableError struct {
	Names []string
	Dirs  []string
	// SpecErrors are the spec files that failed to load, which may be why.
	SpecErrors []string
}

func (e *UnresolvableError) Error() string {
	msg := fmt.Sprintf("unresolvable CDI devices %s (searched %s)", contract.List(e.Names), strings.Join(e.Dirs, ", "))
	if len(e.SpecErrors) > 0 {
		msg += fmt.Sprintf("; %d spec file errors, the first: %s", len(e.SpecErrors), contract.Quote(e.SpecErrors[0]))
	}
	return contract.Bound(errors.New(msg + "; check that the device plugin's CDI spec for them is in one of these directories")).Error()
}

// New reads dirs and watches them until Close. Spec files that fail to load
// are reported by SpecErrors and do not affect the other files.
func New(dirs []string, opts ...Option) (*Resolver, error) {
	if len(dirs) == 0 {
		return nil, errors.New("no CDI spec directories configured; set --cdi-spec-dir")
	}
	r := &Resolver{dirs: slices.Clone(dirs), debounce: DefaultDebounce, log: slog.Default()}
	for _, o := range opts {
		o(r)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch CDI spec directories %s: %w", strings.Join(dirs, ", "), err)
	}
	r.watch(w)
	s, err := r.load()
	if err != nil {
		w.Close()
		return nil, err
	}
	r.current.Store(s)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer w.Close()
		r.run(ctx, w)
	}()
	return r, nil
}

// Close stops watching the spec directories and waits for a running reload.
func (r *Resolver) Close() error {
	r.cancel()
	r.wg.Wait()
	return nil
}

// watch adds each spec dir, or for a dir not there yet its nearest existing
// parent, so the dir's creation is seen too. Adding a dir twice is harmless.
func (r *Resolver) watch(w *fsnotify.Watcher) {
	for _, d := range r.dirs {
		for p := d; ; p = filepath.Dir(p) {
			if err := w.Add(p); err == nil || p == filepath.Dir(p) {
				break
			}
		}
	}
}

func (r *Resolver) run(ctx context.Context, w *fsnotify.Watcher) {
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Create) && slices.Contains(r.dirs, ev.Name) {
				r.watch(w)
			}
			if timer == nil {
				timer = time.After(r.debounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			// An overflow loses events: reload to be safe.
			r.log.Warn("CDI spec directory watch error; reloading", "error", err.Error())
			if timer == nil {
				timer = time.After(r.debounce)
			}
		case <-timer:
			timer = nil
			s, err := r.load()
			if err != nil {
				r.log.Warn("CDI spec reload failed; keeping the previous specs", "error", err.Error())
				continue
			}
			r.current.Store(s)
			r.reloads.Add(1)
		}
	}
}

func (r *Resolver) load() (*snapshot, error) {
	// A dir that does not exist is skipped by the CDI library.
	c, err := cdi.NewCache(cdi.WithSpecDirs(r.dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("read CDI specs in %s: %w", strings.Join(r.dirs, ", "), err)
	}
	s := &snapshot{cache: c}
	for _, path := range slices.Sorted(maps.Keys(c.GetErrors())) {
		for _, e := range c.GetErrors()[path] {
			s.errors = append(s.errors, contract.Bound(fmt.Errorf("%s: %w", path, e)).Error())
		}
	}
	return s, nil
}

// Reloads counts the snapshots taken after the first.
func (r *Resolver) Reloads() int64 { return r.reloads.Load() }

// SpecErrors describes the spec files that failed to load.
func (r *Resolver) SpecErrors() []string { return slices.Clone(r.current.Load().errors) }

// Device is one resolved device, its own (not its spec's common) edits and
// its CDI annotations.
type Device struct {
	Name        string
	Edits       specs.ContainerEdits
	Annotations map[string]string
}

// Result is what a set of names resolves to.
type Result struct {
	// Spec holds the union of all edits, applied by the CDI library to an
	// otherwise empty OCI spec: exactly what containerd's CDI would add.
	Spec    *oci.Spec
	Devices []Device
}

// Resolve resolves names; user is the container's process user, which CDI
// gives device nodes that state no owner.
func (r *Resolver) Resolve(names []string, user oci.User) (Result, error) {
	s := r.current.Load()
	scratch := &oci.Spec{Process: &oci.Process{User: user}, Linux: &oci.Linux{}}
	unresolved, err := s.cache.InjectDevices(scratch, names...)
	if len(unresolved) > 0 {
		return Result{}, &UnresolvableError{Names: unresolved, Dirs: r.dirs, SpecErrors: s.errors}
	}
	if err != nil {
		return Result{}, contract.Bound(fmt.Errorf("apply CDI edits of %s: %w; fix the spec file that defines them", contract.List(names), err))
	}
	res := Result{Spec: scratch, Devices: make([]Device, 0, len(names))}
	for _, n := range names {
		d := s.cache.GetDevice(n)
		if d == nil {
			return Result{}, &UnresolvableError{Names: []string{n}, Dirs: r.dirs, SpecErrors: s.errors}
		}
		res.Devices = append(res.Devices, Device{Name: n, Edits: d.ContainerEdits, Annotations: d.Annotations})
	}
	return res, nil
}
