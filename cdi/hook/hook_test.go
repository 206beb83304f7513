package hook_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/cdi/hook"
	"github.com/nvinject/nvinject/cdi/ldcache"
)

func TestContainerRoot(t *testing.T) {
	bundle := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.2.0","root":{"path":"rootfs"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	noRoot := t.TempDir()
	if err := os.WriteFile(filepath.Join(noRoot, "config.json"), []byte(`{"ociVersion":"1.2.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		state, want, wantErr string
	}{
		{`{"id":"c1","bundle":"` + bundle + `"}`, filepath.Join(bundle, "rootfs"), ""},
		{`{"id":"c1","bundle":"` + bundle + `","root":"/run/crun/c1/rootfs"}`, "/run/crun/c1/rootfs", ""},
		{`{"id":"c1","bundle":"` + noRoot + `"}`, "", "no root.path"},
		{`{"id":"c1","bundle":"/nonexistent"}`, "", "config.json"},
		{`{"id":"c1"}`, "", "no bundle"},
		{`{"id":"c1","root":"/"}`, "", "host's /"},
		{`not json`, "", "createContainer hook"},
		{strings.Repeat(" ", 2<<20), "", "larger than"},
	} {
		got, err := hook.ContainerRoot(strings.NewReader(tc.state))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("state %.60q: root %q, err %v; want error with %q", tc.state, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("state %.60q: root %q, err %v; want %q", tc.state, got, err, tc.want)
		}
	}
}

func openRoot(t *testing.T, dir string) *hook.Root {
	t.Helper()
	r, err := hook.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// A file in the container root is read up to the limit and refused past it.
func TestRootReadFileIsBounded(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.WriteFile(filepath.Join(rootfs, "f"), []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := openRoot(t, rootfs)
	if data, err := r.ReadFile("f", 10); err != nil || string(data) != "0123456789" {
		t.Errorf("ReadFile at the limit = %q, %v", data, err)
	}
	if _, err := r.ReadFile("f", 9); err == nil || !strings.Contains(err.Error(), "f in container root "+rootfs+" is larger than 9 bytes") {
		t.Errorf("ReadFile past the limit: %v; want the file, the root and the limit named", err)
	}
}

// An image is untrusted: its symlinks, absolute or climbing with "..",
// must resolve inside the container root, never reach the host.
func TestHooksStayInsideTheRoot(t *testing.T) {
	outside := t.TempDir()
	rootfs := t.TempDir()
	for link, target := range map[string]string{
		"usr/lib/x86_64-linux-gnu": outside,                        // absolute host path
		"etc":                      "../../../../../../" + outside, // climbs out
		"usr/local/cuda":           "/",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, link)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(rootfs, link)); err != nil {
			t.Fatal(err)
		}
	}
	// The same path inside the root exists: links resolve to it there.
	if err := os.MkdirAll(filepath.Join(rootfs, outside), 0o755); err != nil {
		t.Fatal(err)
	}
	r := openRoot(t, rootfs)
	if err := hook.CreateSymlinks(r, []string{"libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so"}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(rootfs, "compat"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "compat/libcuda.so.580.95.05"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if on, err := hook.EnableCUDACompat(r, "535.261.03", "/compat"); err != nil || !on {
		t.Fatalf("EnableCUDACompat = %v, %v", on, err)
	}
	ents, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("a hook wrote outside the container root: %v", ents)
	}
	// Inside the root the links were followed as the container sees them.
	if got, err := os.Readlink(filepath.Join(rootfs, outside, "libcuda.so")); err != nil || got != "libcuda.so.1" {
		t.Errorf("link in the root = %q, %v", got, err)
	}
	conf, err := os.ReadFile(filepath.Join(rootfs, outside, "ld.so.conf.d/00-nvinject-cuda-compat.conf"))
	if err != nil || string(conf) != "/compat\n" {
		t.Errorf("compat conf = %q, %v", conf, err)
	}
}

func TestCreateSymlinks(t *testing.T) {
	rootfs := t.TempDir()
	lib := filepath.Join(rootfs, "usr/lib")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	// A stale library file of the image is replaced by the link.
	if err := os.WriteFile(filepath.Join(lib, "libcuda.so.1"), []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(lib, "libdir.so"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libdir.so", "keep"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := openRoot(t, rootfs)
	links := []string{"libcuda.so.535.261.03::/usr/lib/libcuda.so.1", "libcuda.so.1::/usr/lib/libcuda.so", "/usr/lib/nvidia/libx.so.1::/new/dir/libx.so.1"}
	for range 2 { // the second run finds every link in place
		if err := hook.CreateSymlinks(r, links); err != nil {
			t.Fatal(err)
		}
	}
	for link, want := range map[string]string{"usr/lib/libcuda.so.1": "libcuda.so.535.261.03", "usr/lib/libcuda.so": "libcuda.so.1", "new/dir/libx.so.1": "/usr/lib/nvidia/libx.so.1"} {
		if got, err := os.Readlink(filepath.Join(rootfs, link)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; want %q", link, got, err, want)
		}
	}
	if err := hook.CreateSymlinks(r, []string{"x::/usr/lib/libdir.so"}); err == nil {
		t.Error("a directory in the link's place was replaced")
	}
	for _, bad := range []string{"nolink", "target::relative/link", "::/abs"} {
		if err := hook.CreateSymlinks(r, []string{bad}); err == nil || !strings.Contains(err.Error(), "TARGET::LINK") {
			t.Errorf("--link=%q: err = %v", bad, err)
		}
	}
	ents, _ := os.ReadDir(lib)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".nvinject-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestEnableCUDACompat(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []string
		host  string
		want  bool
	}{
		{"newer compat", []string{"libcuda.so.580.95.05", "libcuda.so.1"}, "535.261.03", true},
		{"same branch", []string{"libcuda.so.535.300.01"}, "535.261.03", false},
		{"older compat", []string{"libcuda.so.525.60.13"}, "535.261.03", false},
		{"two compat libraries", []string{"libcuda.so.580.95.05", "libcuda.so.575.1.1"}, "535.261.03", false},
		{"no compat dir", nil, "535.261.03", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rootfs := t.TempDir()
			for _, f := range tc.files {
				p := filepath.Join(rootfs, "usr/local/cuda/compat", f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			on, err := hook.EnableCUDACompat(openRoot(t, rootfs), tc.host, "/usr/local/cuda/compat")
			if err != nil || on != tc.want {
				t.Fatalf("EnableCUDACompat = %v, %v; want %v", on, err, tc.want)
			}
			_, err = os.Stat(filepath.Join(rootfs, hook.CompatConf))
			if (err == nil) != tc.want {
				t.Errorf("compat conf present = %v, want %v", err == nil, tc.want)
			}
		})
	}
	if _, err := hook.EnableCUDACompat(openRoot(t, t.TempDir()), "x", "/c"); err == nil {
		t.Error("a bad host driver version was accepted")
	}
}

// update-ldcache runs the host's real ldconfig on the container root: the
// image's cache then lists the library of the given folder by soname.
func TestUpdateLDCache(t *testing.T) {
	const ldconfig = "/sbin/ldconfig"
	if _, err := exec.LookPath(ldconfig); err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and /sbin/ldconfig (ldconfig -r chroots)")
	}
	libs, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/libz.so.1.*")
	if len(libs) == 0 {
		t.Skip("no libz.so.1 on this host to index")
	}
	data, err := os.ReadFile(libs[0])
	if err != nil {
		t.Fatal(err)
	}
	rootfs := t.TempDir()
	drv := filepath.Join(rootfs, "opt/driver")
	if err := os.MkdirAll(drv, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(drv, filepath.Base(libs[0])), data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := openRoot(t, rootfs)
	if out, err := hook.UpdateLDCache(context.Background(), r, ldconfig, []string{"/opt/driver"}); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	cache, err := os.ReadFile(filepath.Join(rootfs, "etc/ld.so.cache"))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := ldcache.Parse(cache)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(entries, func(e ldcache.Entry) bool { return e.Name == "libz.so.1" && e.Path == "/opt/driver/libz.so.1" }) {
		t.Errorf("the container's ld.so.cache lacks libz.so.1 in /opt/driver: %+v", entries)
	}
	conf, err := os.ReadFile(filepath.Join(rootfs, hook.DriverConf))
	if err != nil || string(conf) != "/opt/driver\n" {
		t.Errorf("%s = %q, %v", hook.DriverConf, conf, err)
	}
	if _, err := hook.UpdateLDCache(context.Background(), r, ldconfig, []string{"relative"}); err == nil {
		t.Error("a relative folder was accepted")
	}
}

func TestInstall(t *testing.T) {
	self := filepath.Join(t.TempDir(), "prog")
	if err := os.WriteFile(self, []byte("program"), 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "var/lib/nvinject/bin")
	for range 2 { // a reinstall replaces the file
		dst, err := hook.Install(self, dir)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(dst)
		if err != nil || st.Mode().Perm() != 0o755 || dst != filepath.Join(dir, hook.InstallName) {
			t.Fatalf("installed %s: %v, %v", dst, st, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("install left %d files in %s", len(ents), dir)
	}
	if _, err := hook.Install(filepath.Join(t.TempDir(), "missing"), dir); err == nil {
		t.Error("installing a missing program succeeded")
	}
}

// The OCI state and the bundle's config.json come from outside the hook:
// whatever they hold, the hook names an absolute root other than / or
// refuses, and --link values parse to absolute links or are refused.
func FuzzContainerRoot(f *testing.F) {
	for _, s := range []string{`{"bundle":"/b"}`, `{"root":"rootfs","bundle":"/b"}`, `{"root":"/"}`, `{"root":"../.."}`, `{}`, `[`} {
		f.Add(s, "libcuda.so.1::/usr/lib/libcuda.so")
	}
	f.Fuzz(func(t *testing.T, state, link string) {
		if root, err := hook.ContainerRoot(strings.NewReader(state)); err == nil && (!filepath.IsAbs(root) || root == "/") {
			t.Fatalf("state %q gave the root %q", state, root)
		}
		if target, l, err := hook.ParseLink(link); err == nil && (target == "" || !strings.HasPrefix(l, "/")) {
			t.Fatalf("--link=%q parsed to %q -> %q", link, l, target)
		}
	})
}

// compatLib writes an ELF libcuda carrying NVIDIA's
// .note.cuda.fwd_compatibility note that lists branches, made with objcopy
// from a host library.
func compatLib(t *testing.T, dst string, branches []int) {
	t.Helper()
	objcopy, err := exec.LookPath("objcopy")
	libs, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/libz.so.1.*")
	if err != nil || len(libs) == 0 {
		t.Skip("needs objcopy and a host libz.so.1 to make an ELF with the CUDA compat note")
	}
	desc, err := json.Marshal(map[string]any{"Format": 1, "CUDA Version": "13.0", "Driver": branches})
	if err != nil {
		t.Fatal(err)
	}
	pad := func(b []byte) []byte { return append(b, make([]byte, (4-len(b)%4)%4)...) }
	name := []byte("NVIDIA Corporation\x00")
	desc = append(desc, 0)
	note := binary.LittleEndian.AppendUint32(nil, uint32(len(name)))
	note = binary.LittleEndian.AppendUint32(note, uint32(len(desc)))
	note = binary.LittleEndian.AppendUint32(note, 1)
	note = append(append(note, pad(name)...), pad(desc)...)
	notePath := filepath.Join(t.TempDir(), "note.bin")
	if err := os.WriteFile(notePath, note, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(objcopy, "--add-section", ".note.cuda.fwd_compatibility="+notePath, libs[0], dst).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, out)
	}
}

// With the ELF note, the branches it lists decide, not the major version.
func TestEnableCUDACompatELFNote(t *testing.T) {
	for _, tc := range []struct {
		name     string
		branches []int
		host     string
		want     bool
	}{
		{"host branch listed", []int{535, 550}, "535.261.03", true},
		{"host branch not listed", []int{550, 570}, "535.261.03", false},
		{"listed but not newer", []int{580}, "580.95.05", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rootfs := t.TempDir()
			compatLib(t, filepath.Join(rootfs, "usr/local/cuda/compat/libcuda.so.580.95.05"), tc.branches)
			on, err := hook.EnableCUDACompat(openRoot(t, rootfs), tc.host, "/usr/local/cuda/compat")
			if err != nil || on != tc.want {
				t.Fatalf("EnableCUDACompat = %v, %v; want %v", on, err, tc.want)
			}
		})
	}
}
