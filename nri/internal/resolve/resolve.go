// Package resolve turns qualified CDI device names into the OCI edits they
// stand for, using the CDI library's cache of the spec directories.
package resolve

import (
	"errors"
	"fmt"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Resolver resolves CDI names against a set of spec directories. The cache
// watches the directories (auto-refresh), so resolving never scans them.
type Resolver struct {
	cache *cdi.Cache
	dirs  []string
}

// UnresolvableError lists the names no spec in Dirs defines.
type UnresolvableError struct {
	Names []string
	Dirs  []string
	// SpecErrors are the spec files that failed to load, which may be why.
	SpecErrors []string
}

func (e *UnresolvableError) Error() string {
	msg := fmt.Sprintf("unresolvable CDI devices %s (searched %s)", strings.Join(e.Names, ", "), strings.Join(e.Dirs, ", "))
	if len(e.SpecErrors) > 0 {
		msg += "; spec files with errors: " + strings.Join(e.SpecErrors, "; ")
	}
	return msg + "; check that the device plugin's CDI spec for them is in one of these directories"
}

// New opens a cache over dirs. Spec files that fail to load are reported by
// SpecErrors and do not affect the other files.
func New(dirs []string) (*Resolver, error) {
	if len(dirs) == 0 {
		return nil, errors.New("no CDI spec directories configured; set --cdi-spec-dir")
	}
	c, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(true))
	if err != nil {
		return nil, fmt.Errorf("open CDI cache over %s: %w", strings.Join(dirs, ", "), err)
	}
	return &Resolver{cache: c, dirs: dirs}, nil
}

// Close stops watching the spec directories.
func (r *Resolver) Close() error {
	return r.cache.Configure(cdi.WithAutoRefresh(false))
}

// SpecErrors describes the spec files (and directories) that failed to load.
func (r *Resolver) SpecErrors() []string {
	var out []string
	for path, errs := range r.cache.GetErrors() {
		for _, e := range errs {
			out = append(out, fmt.Sprintf("%s: %v", path, e))
		}
	}
	return out
}

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
	scratch := &oci.Spec{Process: &oci.Process{User: user}, Linux: &oci.Linux{}}
	unresolved, err := r.cache.InjectDevices(scratch, names...)
	if len(unresolved) > 0 {
		return Result{}, &UnresolvableError{Names: unresolved, Dirs: r.dirs, SpecErrors: r.SpecErrors()}
	}
	if err != nil {
		return Result{}, fmt.Errorf("apply CDI edits of %s: %w; fix the spec file that defines them", strings.Join(names, ", "), err)
	}
	res := Result{Spec: scratch, Devices: make([]Device, 0, len(names))}
	for _, n := range names {
		d := r.cache.GetDevice(n)
		if d == nil {
			return Result{}, &UnresolvableError{Names: []string{n}, Dirs: r.dirs, SpecErrors: r.SpecErrors()}
		}
		res.Devices = append(res.Devices, Device{Name: n, Edits: d.ContainerEdits, Annotations: d.Annotations})
	}
	return res, nil
}
