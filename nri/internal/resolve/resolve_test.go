package resolve

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/shared/fswatch"
)

func writeSpec(t testing.TB, dir, file, kind, dev string) {
	t.Helper()
	s := fmt.Sprintf("cdiVersion: 0.6.0\nkind: %s\ndevices:\n- name: %s\n  containerEdits:\n    env: [X_%s=1]\n", kind, dev, dev)
	tmp := filepath.Join(dir, "."+file+".tmp")
	if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
		t.Fatal(err)
	}
}

// until polls cond and returns how long it took to hold.
func until(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	t0 := time.Now()
	for !cond() {
		if time.Since(t0) > 5*time.Second {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(t0)
}

// TestFollowsTheDirectory: a spec added, removed, or placed in a spec dir
// that did not exist when the resolver started shows in Resolve within the
// stated bound (debounce plus one reload, or one poll where inotify cannot
// watch: before the poll, a resolver failed to start without inotify).
func TestFollowsTheDirectory(t *testing.T) {
	for _, m := range []struct {
		name string
		opts []Option
	}{
		{"inotify", nil},
		{"poll only", []Option{func(r *Resolver) { r.watchOpts = []fswatch.Option{fswatch.PollOnly()} }}},
	} {
		t.Run(m.name, func(t *testing.T) { followsTheDirectory(t, m.opts...) })
	}
}

func followsTheDirectory(t *testing.T, opts ...Option) {
	root := t.TempDir()
	dir, later := filepath.Join(root, "cdi"), filepath.Join(root, "run", "cdi")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeSpec(t, dir, "a.yaml", "example.com/a", "d0")
	r, err := New([]string{dir, later}, append([]Option{WithDebounce(20 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ok := func(name string) func() bool {
		return func() bool { _, err := r.Resolve([]string{name}, oci.User{}); return err == nil }
	}
	gone := func(name string) func() bool {
		return func() bool {
			_, err := r.Resolve([]string{name}, oci.User{})
			var u *UnresolvableError
			return errors.As(err, &u)
		}
	}
	if !ok("example.com/a=d0")() {
		t.Fatal("initial spec not resolved")
	}
	const bound = time.Second
	writeSpec(t, dir, "b.yaml", "example.com/b", "d1")
	if d := until(t, "added spec", ok("example.com/b=d1")); d > bound {
		t.Errorf("added spec resolved after %s, bound %s", d, bound)
	}
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	if d := until(t, "removed spec", gone("example.com/a=d0")); d > bound {
		t.Errorf("removed spec refused after %s, bound %s", d, bound)
	}
	if err := os.MkdirAll(later, 0o755); err != nil {
		t.Fatal(err)
	}
	writeSpec(t, later, "c.yaml", "example.com/c", "d2")
	if d := until(t, "spec in a new dir", ok("example.com/c=d2")); d > bound {
		t.Errorf("spec in a dir created later resolved after %s, bound %s", d, bound)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("cdiVersion: [x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	until(t, "spec error reported", func() bool { return len(r.SpecErrors()) == 1 })
	if !ok("example.com/b=d1")() {
		t.Error("a broken spec file beside a good one made the good one unresolvable")
	}
}

// TestUnresolvableErrorIsBounded: a huge name and many broken files still
// give a short error that counts what it leaves out.
func TestUnresolvableErrorIsBounded(t *testing.T) {
	dir := t.TempDir()
	for i := range 100 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("bad%03d.yaml", i)), []byte("cdiVersion: [x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = r.Resolve([]string{"example.com/a=" + strings.Repeat("x", 1<<20), "example.com/a=b"}, oci.User{})
	if err == nil {
		t.Fatal("resolved a name no spec defines")
	}
	if n := len(err.Error()); n > 1200 {
		t.Errorf("error is %d bytes: %.300s", n, err)
	}
	if !strings.Contains(err.Error(), "100 spec file errors") || !strings.Contains(err.Error(), "more bytes") {
		t.Errorf("error does not count what it cut: %.600s", err)
	}
}

// TestMatchesTheCDICache: Resolve applies exactly what the CDI library's
// cache (containerd's CDI) applies, for nvinject's generated spec beside
// others, a device overridden by a later spec dir and a conflict of two
// files in one dir (neither counts).
func TestMatchesTheCDICache(t *testing.T) {
	node := nritest.NewNode(t, "sim:a100-80gb*4", true)
	later := t.TempDir()
	writeSpec(t, node.SpecDir, "x1.yaml", "example.com/x", "dup")
	writeSpec(t, node.SpecDir, "x2.yaml", "example.com/x", "dup")
	writeSpec(t, node.SpecDir, "y.yaml", "example.com/y", "d0")
	if err := os.WriteFile(filepath.Join(later, "y.json"), []byte(`{"cdiVersion":"0.6.0","kind":"example.com/y","containerEdits":{"env":["Y_COMMON=1"]},"devices":[{"name":"d0","containerEdits":{"env":["Y_LATER=1"]}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	dirs := []string{node.SpecDir, later}
	r, err := New(dirs)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	user := oci.User{UID: 1000, GID: 1000}
	for _, names := range [][]string{
		{node.Name(0)}, {node.Name(3), node.Name(1)}, {node.Name(2), "example.com/y=d0"},
		{"example.com/x=dup"}, {node.Name(0), "example.com/none=z"},
	} {
		want := &oci.Spec{Process: &oci.Process{User: user}, Linux: &oci.Linux{}}
		wantUnres, wantErr := cache.InjectDevices(want, names...)
		got, err := r.Resolve(names, user)
		var u *UnresolvableError
		switch {
		case wantErr != nil:
			if !errors.As(err, &u) || !slices.Equal(u.Names, wantUnres) {
				t.Errorf("%v: CDI cache: unresolved %v (%v); Resolve: %v", names, wantUnres, wantErr, err)
			}
		case err != nil:
			t.Errorf("%v: CDI cache resolves, Resolve: %v", names, err)
		case !reflect.DeepEqual(got.Spec, want):
			t.Errorf("%v: edits differ from the CDI cache's:\n got %+v\nwant %+v", names, got.Spec, want)
		}
	}
	if n := len(r.SpecErrors()); n == 0 {
		t.Error("the conflict of x1.yaml and x2.yaml is not reported")
	}
}

func TestDevice(t *testing.T) {
	node := nritest.NewNode(t, "sim:a100-80gb*2", false)
	r, err := New([]string{node.SpecDir})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d, ok := r.Device(node.Name(1))
	want := fmt.Sprintf("NVINJECT_GPU_UUID_%d=%s", node.Devices[1].Minor, node.Devices[1].UUID)
	if !ok || d.Name != node.Name(1) || !slices.Contains(d.Edits.Env, want) {
		t.Fatalf("Device = %+v, %v; want its own edits with %s", d, ok, want)
	}
	if _, ok := r.Device("nvidia.com/gpu=GPU-none"); ok {
		t.Error("a name no spec defines was found")
	}
}

// Resolve answers a repeated request from the snapshot's results, keyed by
// names and user, bounded; a spec changed in place is answered anew once
// reloaded, never from an older snapshot's result.
func TestResolvedResultsKeptPerSnapshot(t *testing.T) {
	dir := t.TempDir()
	writeSpec(t, dir, "a.yaml", "example.com/a", "d0")
	r, err := New([]string{dir}, WithDebounce(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	names := []string{"example.com/a=d0"}
	first, err := r.Resolve(names, oci.User{UID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	again, _ := r.Resolve(names, oci.User{UID: 1000})
	if again.Spec != first.Spec {
		t.Error("the same names and user were resolved again instead of answered from the snapshot")
	}
	if other, _ := r.Resolve(names, oci.User{UID: 1000, AdditionalGids: []uint32{5}}); other.Spec == first.Spec {
		t.Error("another user's request was answered with the first user's result")
	}
	for uid := range uint32(3 * resolvedCap) {
		if _, err := r.Resolve(names, oci.User{UID: uid}); err != nil {
			t.Fatal(err)
		}
	}
	s := r.current.Load()
	s.mu.Lock()
	kept := len(s.resolved)
	s.mu.Unlock()
	if kept > resolvedCap {
		t.Errorf("the snapshot keeps %d results, bound %d", kept, resolvedCap)
	}

	s0 := "cdiVersion: 0.6.0\nkind: example.com/a\ndevices:\n- name: d0\n  containerEdits:\n    env: [X_d0=2]\n"
	if err := os.WriteFile(filepath.Join(dir, ".a.tmp"), []byte(s0), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, ".a.tmp"), filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	until(t, "changed spec resolved anew", func() bool {
		res, err := r.Resolve(names, oci.User{UID: 1000})
		return err == nil && slices.Contains(res.Spec.Process.Env, "X_d0=2")
	})
}
