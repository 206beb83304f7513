package hook_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"golang.org/x/sys/unix"

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
		{`{"id":"c1","root":"/run/../"}`, "", "host's /"},
		{`{"id":"c1","bundle":"/b","root":"../../.."}`, "", "leaves the bundle"},
		{`{"id":"c1","bundle":"/b","root":"../etc"}`, "", "leaves the bundle"},
		{`{"id":"c1","bundle":"b","root":"rootfs"}`, "", "not an absolute path"},
		{`{"id":"c1","root":"/r\u0000"}`, "", "NUL"},
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

// A root that leads to the host's /, or out of the bundle, through links
// is refused once opened: no hook ever works on it.
func TestOpenContainerRootRefuses(t *testing.T) {
	outside := t.TempDir()
	for name, target := range map[string]string{"root link to /": "/", "root link out of the bundle": outside, "root link climbing": "../../../../../../../.."} {
		t.Run(name, func(t *testing.T) {
			bundle := t.TempDir()
			if err := os.Symlink(target, filepath.Join(bundle, "rootfs")); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"root":{"path":"rootfs"}}`), 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := hook.OpenContainerRoot(strings.NewReader(`{"bundle":"` + bundle + `"}`))
			if err == nil {
				r.Close()
				t.Fatalf("the root %s -> %s was opened", filepath.Join(bundle, "rootfs"), target)
			}
			if !strings.Contains(err.Error(), "refusing") || len(err.Error()) > 1000 {
				t.Errorf("error %q does not refuse, or is not bounded", err)
			}
		})
	}
	bundle := t.TempDir()
	if err := os.Mkdir(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"root":{"path":"rootfs"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := hook.OpenContainerRoot(strings.NewReader(`{"bundle":"` + bundle + `"}`))
	if err != nil {
		t.Fatalf("a plain bundle root was refused: %v", err)
	}
	r.Close()
	if r, err := hook.OpenRoot("/"); err == nil {
		r.Close()
		t.Error("OpenRoot(/) succeeded")
	}
}

// /proc's magic links lead out of any root: with the host's procfs at
// ROOT/proc (as runc mounts the container's before createContainer hooks
// run), /proc/1/root and /proc/self/cwd are refused, for reads and writes.
func TestRootRefusesMagicLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a procfs needs root")
	}
	rootfs := t.TempDir()
	proc := filepath.Join(rootfs, "proc")
	if err := os.Mkdir(proc, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Skipf("mount proc: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(proc, unix.MNT_DETACH) })
	for link, target := range map[string]string{"etc": "/proc/1/root/etc", "lib": "/proc/self/cwd"} {
		if err := os.Symlink(target, filepath.Join(rootfs, link)); err != nil {
			t.Fatal(err)
		}
	}
	r := openRoot(t, rootfs)
	for _, p := range []string{"proc/1/root/etc/hostname", "etc/hostname", "lib/x"} {
		// ELOOP for a magic link; EACCES where ptrace rules deny pid 1's
		// root before resolution gets there.
		if _, err := r.ReadFile(p, 1<<20); !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.EACCES) {
			t.Errorf("ReadFile(%s) = %v, want ELOOP (a magic link)", p, err)
		}
	}
	if err := r.WriteFile("/etc/ld.so.cache", []byte("x")); err == nil {
		t.Error("WriteFile through /proc/1/root succeeded")
	}
	if err := r.Symlink("x", "/proc/1/root/tmp/nvinject-escape"); err == nil {
		t.Error("Symlink through /proc/1/root succeeded")
	}
	if dirs, err := ldcache.ConfDirs(r); err != nil || len(dirs) != 0 {
		t.Errorf("ConfDirs through /proc/1/root/etc = %q, %v", dirs, err)
	}
}

// Root is an fs.FS (ConfDirs reads through it) that behaves as one.
func TestRootFS(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "etc/ld.so.conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for p, data := range map[string]string{"etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n", "etc/ld.so.conf.d/a.conf": "/opt/a\n"} {
		if err := os.WriteFile(filepath.Join(rootfs, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := fstest.TestFS(openRoot(t, rootfs), "etc/ld.so.conf", "etc/ld.so.conf.d/a.conf"); err != nil {
		t.Fatal(err)
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
	if _, err := r.ReadFile("f", 9); err == nil || !strings.Contains(err.Error(), `"f" in container root "`+rootfs+`" is larger than 9 bytes`) {
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
			// The image's own copy of the drop-in, naming its choice of
			// directory: replaced when compat is on, removed when off.
			stale := filepath.Join(rootfs, hook.CompatConf)
			if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(stale, []byte("-r /host -X -C /victim\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			on, err := hook.EnableCUDACompat(openRoot(t, rootfs), tc.host, "/usr/local/cuda/compat")
			if err != nil || on != tc.want {
				t.Fatalf("EnableCUDACompat = %v, %v; want %v", on, err, tc.want)
			}
			if data, err := os.ReadFile(stale); tc.want && string(data) != "/usr/local/cuda/compat\n" {
				t.Errorf("compat conf = %q, %v", data, err)
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
	if _, err := hook.EnableCUDACompat(openRoot(t, t.TempDir()), "535.261.03", "relative"); err == nil {
		t.Error("a relative compat directory was accepted")
	}
	// Without a host driver version (an nvidia-cdi-hook spec made that
	// way), compat stays off and an image's drop-in goes.
	rootfs := t.TempDir()
	stale := filepath.Join(rootfs, hook.CompatConf)
	if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stale, []byte("/x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if on, err := hook.EnableCUDACompat(openRoot(t, rootfs), "", "/usr/local/cuda/compat"); on || err != nil {
		t.Errorf("EnableCUDACompat without a host version = %v, %v", on, err)
	}
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("the image's %s is still there: %v", hook.CompatConf, err)
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

// The hook's other arguments come from a spec a node's admin or an
// operator wrote: a --folder, a --host-driver-version, a compat
// directory. Whatever they are, the hook fails or works inside its root,
// leaving everything beside the root as it was.
func FuzzHookArgs(f *testing.F) {
	f.Add("/usr/lib/x86_64-linux-gnu", "535.261.03", "/usr/local/cuda/compat")
	f.Add("/proc/1/root/etc", "-r /x", "../../..")
	f.Add("/", "1.2", "/etc/ld.so.conf.d")
	f.Fuzz(func(t *testing.T, folder, version, compat string) {
		parent := t.TempDir()
		rootfs := filepath.Join(parent, "rootfs")
		if err := os.MkdirAll(filepath.Join(rootfs, "usr/local/cuda/compat"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rootfs, "usr/local/cuda/compat/libcuda.so.580.95.05"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := hook.OpenRoot(rootfs)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		_, _ = hook.EnableCUDACompat(r, version, compat)
		if _, err := hook.UpdateLDCache(r, []string{folder}); err == nil && (!strings.HasPrefix(folder, "/") || strings.ContainsAny(folder, "\x00\n")) {
			t.Fatalf("--folder=%q was accepted", folder)
		}
		if ents, err := os.ReadDir(parent); err != nil || len(ents) != 1 {
			t.Fatalf("beside the root: %v, %v", ents, err)
		}
	})
}
