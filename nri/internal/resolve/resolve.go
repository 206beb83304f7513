// Package resolve turns qualified CDI device names into the OCI edits they
// stand for, exactly as containerd's CDI support applies them (the CDI
// library's own edits, merged and applied the way its cache does).
//
// Spec changes never stall a lookup: the spec files are parsed one by one
// into a snapshot that Resolve reads without a lock. A watch on the spec
// directories (shared/fswatch, which polls one it cannot watch) collects
// the changed files for a short debounce, parses only those again, builds
// the next snapshot off the hot path and swaps it in.
package resolve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/fswatch"
)

// DefaultDebounce is how long a reload collects file events after the first
// one, so that a burst of writes costs one snapshot. A change shows in
// Resolve within about this long plus parsing the changed files.
const DefaultDebounce = 20 * time.Millisecond

// Resolver resolves CDI names against a set of spec directories.
type Resolver struct {
	dirs     []string
	debounce time.Duration
	log      *slog.Logger
	current  atomic.Pointer[snapshot]
	reloads  atomic.Int64
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	// watchOpts are added to the directory watch's; tests poll.
	watchOpts []fswatch.Option
	// files is owned by the watch goroutine after New.
	files map[string]file
}

// file is one spec file as last read.
type file struct {
	priority int
	stamp    stamp
	spec     *cdi.Spec
	err      error
}

// stamp identifies a file's content without reading it.
type stamp struct {
	size    int64
	modTime time.Time
	ino     uint64
}

// snapshot is the spec directories as read at one moment.
type snapshot struct {
	devices map[string]*cdi.Device
	errors  []string
	// resolved keeps what Resolve computed for a set of names and a user,
	// for this snapshot only: applying the edits (sorting mounts, stat-ing
	// device nodes) is most of a container's cost, and the same GPUs are
	// asked for again and again. A reload starts a new snapshot, so a spec
	// change is never answered from here.
	mu       sync.Mutex
	resolved map[string]Result
}

// resolvedCap bounds the results a snapshot keeps; the container's user is
// in the key, and users are the container's to choose.
const resolvedCap = 256

func resolvedKey(names []string, user oci.User) string {
	b := make([]byte, 0, 64)
	for _, n := range names {
		b = append(append(b, n...), 0)
	}
	b = strconv.AppendUint(append(b, 'u'), uint64(user.UID), 10)
	b = strconv.AppendUint(append(b, 'g'), uint64(user.GID), 10)
	for _, g := range user.AdditionalGids {
		b = strconv.AppendUint(append(b, ','), uint64(g), 10)
	}
	return string(b)
}

// Option configures a Resolver.
type Option func(*Resolver)

// WithDebounce sets how long a reload collects file events (default
// DefaultDebounce).
func WithDebounce(d time.Duration) Option { return func(r *Resolver) { r.debounce = d } }

// WithLogger sets where watch failures are reported.
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
	r := &Resolver{dirs: slices.Clone(dirs), debounce: DefaultDebounce, log: slog.Default(), files: map[string]file{}}
	for i, d := range r.dirs {
		r.dirs[i] = filepath.Clean(d)
	}
	for _, o := range opts {
		o(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := fswatch.Start(ctx, r.dirs, append([]fswatch.Option{fswatch.WithDebounce(r.debounce),
		fswatch.WithLogger(r.log.With("watch", "CDI spec directories"))}, r.watchOpts...)...)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch CDI spec directories %s: %w", strings.Join(dirs, ", "), err)
	}
	r.rescan()
	r.cancel = cancel
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer w.Close()
		r.run(ctx, w.Changes())
	}()
	return r, nil
}

// Close stops watching the spec directories and waits for a running reload.
func (r *Resolver) Close() error {
	r.cancel()
	r.wg.Wait()
	return nil
}

func (r *Resolver) run(ctx context.Context, changes <-chan fswatch.Change) {
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-changes:
			if c.Rescan {
				r.rescan()
			} else {
				for _, p := range c.Paths {
					r.reread(p, true)
					// Parsing is the one costly step; let the hot path
					// run between files.
					runtime.Gosched()
				}
				r.publish()
			}
			r.reloads.Add(1)
		}
	}
}

// isSpec reports whether the CDI library would read the file at path.
func isSpec(path string) bool {
	ext := filepath.Ext(path)
	return ext == ".json" || ext == ".yaml"
}

// rescan lists every spec dir, rereads the files that changed and publishes.
func (r *Resolver) rescan() {
	seen := map[string]bool{}
	for _, d := range r.dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			p := filepath.Join(d, e.Name())
			if !e.IsDir() && isSpec(p) {
				seen[p] = true
				r.reread(p, false)
			}
		}
	}
	for p := range r.files {
		if !seen[p] {
			delete(r.files, p)
		}
	}
	r.publish()
}

// reread reads path again, unless force is false and its stamp is
// unchanged (a rescan without an event for it); a file that is gone, not a
// spec file, or a directory is dropped.
func (r *Resolver) reread(path string, force bool) {
	prio := slices.Index(r.dirs, filepath.Dir(path))
	fi, err := os.Stat(path)
	if prio < 0 || !isSpec(path) || errors.Is(err, fs.ErrNotExist) || (err == nil && fi.IsDir()) {
		delete(r.files, path)
		return
	}
	var st stamp
	if err == nil {
		st = stampOf(fi)
		if old, ok := r.files[path]; ok && !force && old.stamp == st && old.priority == prio {
			return
		}
	}
	s, err := cdi.ReadSpec(path, prio)
	if errors.Is(err, fs.ErrNotExist) {
		delete(r.files, path)
		return
	}
	r.files[path] = file{priority: prio, stamp: st, spec: s, err: err}
}

// publish builds a snapshot from the files read, resolving a device
// defined twice as the CDI library's cache does (a later spec dir wins; two
// files of one dir defining it are a conflict and neither counts), and
// swaps it in.
func (r *Resolver) publish() {
	paths := slices.SortedFunc(maps.Keys(r.files), func(a, b string) int {
		return cmp.Or(cmp.Compare(r.files[a].priority, r.files[b].priority), cmp.Compare(a, b))
	})
	s := &snapshot{devices: map[string]*cdi.Device{}}
	conflicts := map[string]bool{}
	for _, p := range paths {
		f := r.files[p]
		if f.err != nil {
			s.errors = append(s.errors, contract.Bound(fmt.Errorf("%s: failed to load CDI Spec %w", p, f.err)).Error())
			continue
		}
		for _, raw := range f.spec.Devices {
			d := f.spec.GetDevice(raw.Name)
			name := parser.QualifiedName(f.spec.GetVendor(), f.spec.GetClass(), raw.Name)
			if old, ok := s.devices[name]; ok && old.GetSpec().GetPriority() == f.priority {
				conflicts[name] = true
				s.errors = append(s.errors, contract.Bound(fmt.Errorf("%s: conflicting device %q (specs %q, %q)", p, name, p, old.GetSpec().GetPath())).Error())
			}
			s.devices[name] = d
		}
	}
	for name := range conflicts {
		delete(s.devices, name)
	}
	r.current.Store(s)
}

// Reloads counts the snapshots published after the first.
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

// Device returns the device name resolves to, without applying its edits:
// a look-up for names another container holds.
func (r *Resolver) Device(name string) (Device, bool) {
	d := r.current.Load().devices[name]
	if d == nil {
		return Device{}, false
	}
	return Device{Name: name, Edits: d.ContainerEdits, Annotations: d.Annotations}, true
}

// Resolve resolves names; user is the container's process user, which CDI
// gives device nodes that state no owner. The Result is shared with later
// calls for the same names and user: callers read it and never change it.
func (r *Resolver) Resolve(names []string, user oci.User) (Result, error) {
	s := r.current.Load()
	key := resolvedKey(names, user)
	s.mu.Lock()
	res, ok := s.resolved[key]
	s.mu.Unlock()
	if ok {
		return res, nil
	}
	res, err := s.resolve(r.dirs, names, user)
	if err != nil {
		return Result{}, err
	}
	s.mu.Lock()
	if s.resolved == nil || len(s.resolved) >= resolvedCap {
		s.resolved = make(map[string]Result, resolvedCap)
	}
	s.resolved[key] = res
	s.mu.Unlock()
	return res, nil
}

func (s *snapshot) resolve(dirs []string, names []string, user oci.User) (Result, error) {
	res := Result{Spec: &oci.Spec{Process: &oci.Process{User: user}, Linux: &oci.Linux{}}, Devices: make([]Device, 0, len(names))}
	// The CDI cache's InjectDevices: each spec's common edits once, before
	// its first device's, all merged, then applied.
	edits := &cdi.ContainerEdits{}
	seen := map[*cdi.Spec]bool{}
	var unresolved []string
	for _, n := range names {
		d := s.devices[n]
		if d == nil {
			unresolved = append(unresolved, n)
			continue
		}
		if sp := d.GetSpec(); !seen[sp] {
			seen[sp] = true
			edits.Append(&cdi.ContainerEdits{ContainerEdits: &sp.ContainerEdits})
		}
		edits.Append(&cdi.ContainerEdits{ContainerEdits: &d.ContainerEdits})
		res.Devices = append(res.Devices, Device{Name: n, Edits: d.ContainerEdits, Annotations: d.Annotations})
	}
	if len(unresolved) > 0 {
		return Result{}, &UnresolvableError{Names: unresolved, Dirs: dirs, SpecErrors: s.errors}
	}
	if err := edits.Apply(res.Spec); err != nil {
		return Result{}, contract.Bound(fmt.Errorf("apply CDI edits of %s: %w; fix the spec file that defines them", contract.List(names), err))
	}
	return res, nil
}
