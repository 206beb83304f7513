package driverroot_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/driverroot"
)

// root builds a tree: files maps a path to "" (an empty file), "dir/"
// (a directory) or "->target" (a symlink).
func root(t *testing.T, files map[string]string) string {
	t.Helper()
	r := t.TempDir()
	for p, v := range files {
		full := filepath.Join(r, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasPrefix(v, "->"):
			err = os.Symlink(strings.TrimPrefix(v, "->"), full)
		case v == "dir/":
			err = os.MkdirAll(full, 0o755)
		default:
			err = os.WriteFile(full, []byte(v), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return r
}

const lib = "/usr/lib/x86_64-linux-gnu"

// A Debian-layout root: the public names are absolute links through
// /etc/alternatives, which must resolve inside the root, never on the host.
func debianRoot(t *testing.T) string {
	return root(t, map[string]string{
		lib + "/nvidia/current/libnvidia-ml.so.535.261.03":             "",
		lib + "/nvidia/current/libnvidia-ml.so.1":                      "->libnvidia-ml.so.535.261.03",
		lib + "/libnvidia-ml.so.1":                                     "->/etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu",
		"/etc/alternatives/nvidia--libnvidia-ml.so.1-x86_64-linux-gnu": "->" + lib + "/nvidia/current/libnvidia-ml.so.1",
		"/usr/lib/nvidia/current/nvidia-smi":                           "",
		"/etc/alternatives/nvidia":                                     "->/usr/lib/nvidia/current",
		"/usr/lib/nvidia/nvidia":                                       "->/etc/alternatives/nvidia",
		"/usr/bin/nvidia-smi":                                          "->/usr/lib/nvidia/nvidia/nvidia-smi",
		"/escape":                                                      "->../../../../etc",
		"/abs-escape":                                                  "->/../../etc/passwd",
		"/etc/passwd":                                                  "root-of-the-driver-root",
		"/loop-a":                                                      "->/loop-b",
		"/loop-b":                                                      "->loop-a",
		"/dangling":                                                    "->/nowhere",
	})
}

func TestResolve(t *testing.T) {
	r := debianRoot(t)
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{lib + "/libnvidia-ml.so.1", lib + "/nvidia/current/libnvidia-ml.so.535.261.03", nil},
		{"/usr/bin/nvidia-smi", "/usr/lib/nvidia/current/nvidia-smi", nil},
		{"/usr/lib/nvidia/nvidia/../current/nvidia-smi", "/usr/lib/nvidia/current/nvidia-smi", nil},
		{"/escape/passwd", "/etc/passwd", nil},
		{"/abs-escape", "/etc/passwd", nil},
		{"/../../../etc/passwd", "/etc/passwd", nil},
		{"/loop-a", "", driverroot.ErrTooManyLinks},
		{"/dangling", "", fs.ErrNotExist},
		{"/usr/bin/nvidia-smi/x", "", nil},
	} {
		got, err := driverroot.Resolve(r, tc.in)
		if tc.err != nil || tc.want == "" {
			if err == nil || (tc.err != nil && !errors.Is(err, tc.err)) {
				t.Errorf("Resolve(%s) = %q, %v; want error %v", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		data, err := os.ReadFile(filepath.Join(r, got))
		if tc.want == "/etc/passwd" && (err != nil || string(data) != "root-of-the-driver-root") {
			t.Errorf("Resolve(%s) left the driver root: read %q, %v", tc.in, data, err)
		}
	}
	if _, err := driverroot.Resolve(r, "relative"); err == nil {
		t.Error("a relative path was accepted")
	}
}

func TestFindLibraryAndVersion(t *testing.T) {
	r := debianRoot(t)
	if got, want := driverroot.FindLibrary(r, "libnvidia-ml.so.1"), filepath.Join(r, lib, "nvidia/current/libnvidia-ml.so.535.261.03"); got != want {
		t.Errorf("FindLibrary = %q, want %q", got, want)
	}
	if got := driverroot.FindLibrary(r, "libcuda.so.1"); got != "" {
		t.Errorf("FindLibrary(libcuda.so.1) = %q in a root without it", got)
	}
	v, ok, err := driverroot.DriverVersion(r)
	if err != nil || !ok || v.Version != "535.261.03" || v.File != lib+"/nvidia/current/libnvidia-ml.so.535.261.03" {
		t.Errorf("DriverVersion = %+v, %v, %v", v, ok, err)
	}

	// No soname link: the one versioned file names the driver.
	flat := root(t, map[string]string{lib + "/libcuda.so.580.95.05": "", lib + "/libnvidia-ml.so.580.95.05": ""})
	if v, ok, err := driverroot.DriverVersion(flat); err != nil || !ok || v.Version != "580.95.05" {
		t.Errorf("DriverVersion(no soname link) = %+v, %v, %v", v, ok, err)
	}
	two := root(t, map[string]string{lib + "/libnvidia-ml.so.580.95.05": "", lib + "/libnvidia-ml.so.535.261.03": ""})
	if _, _, err := driverroot.DriverVersion(two); err == nil || !strings.Contains(err.Error(), "ldconfig -r") {
		t.Errorf("two driver versions: err = %v, want one naming both and ldconfig -r", err)
	}
	if _, ok, err := driverroot.DriverVersion(t.TempDir()); ok || err != nil {
		t.Errorf("empty root: ok=%v err=%v", ok, err)
	}
}

// Whatever the links in a root say, Resolve never names a path above it.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"../../etc", "/etc/../..", "a/b/../../..", "/", ".."} {
		f.Add(s, "/x/y")
	}
	f.Fuzz(func(t *testing.T, target, p string) {
		r := t.TempDir()
		if err := os.MkdirAll(filepath.Join(r, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(r, "x", "y")); err != nil {
			t.Skip()
		}
		if !strings.HasPrefix(p, "/") {
			p = "/" + p
		}
		got, err := driverroot.Resolve(r, p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/") || strings.Contains(got, "/../") || strings.HasSuffix(got, "/..") {
			t.Fatalf("Resolve(%q) with x/y -> %q = %q, outside the root's namespace", p, target, got)
		}
		if _, err := os.Lstat(filepath.Join(r, got)); err != nil {
			t.Fatalf("Resolve(%q) = %q, which does not exist: %v", p, got, err)
		}
	})
}

// A system root keeps its own dev/; a driver directory's devices are the
// host's; --dev-root wins.
func TestDevRoot(t *testing.T) {
	system := root(t, map[string]string{"/usr/lib/": "dir/"})
	merged := root(t, map[string]string{"/real-usr/bin/": "dir/", "/usr": "->/real-usr"})
	driverDir := root(t, map[string]string{"/lib64/libcuda.so.1": "", "/bin/nvidia-smi": "", "/usr/share/nvinject/x": ""})
	for _, tt := range []struct {
		name, root, given, want string
		system                  bool
	}{
		{"host", "/", "", "/", true},
		{"system root", system, "", system, true},
		{"usr a link inside the root", merged, "", merged, true},
		{"driver directory", driverDir, "", "/", false},
		{"given", driverDir, "/host", "/host", false},
		{"given over a system root", system, "/", "/", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := driverroot.IsSystemRoot(tt.root); got != tt.system {
				t.Errorf("IsSystemRoot(%s) = %v, want %v", tt.root, got, tt.system)
			}
			if got := driverroot.DevRoot(tt.root, tt.given); got != tt.want {
				t.Errorf("DevRoot(%s, %q) = %q, want %q", tt.root, tt.given, got, tt.want)
			}
		})
	}
}

// FS follows an absolute link inside the root, not to the host.
func TestFS(t *testing.T) {
	r := root(t, map[string]string{"/etc/real.conf": "/opt/lib\n", "/etc/ld.so.conf.d/x.conf": "->/etc/real.conf", "/etc/passwd": "->/etc/real.conf"})
	for _, name := range []string{"etc/ld.so.conf.d/x.conf", "etc/passwd"} {
		b, err := fs.ReadFile(driverroot.FS(r), name)
		if err != nil || string(b) != "/opt/lib\n" {
			t.Errorf("%s = %q, %v; want the root's file", name, b, err)
		}
	}
	if _, err := fs.ReadFile(driverroot.FS(r), "etc/missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	ents, err := fs.ReadDir(driverroot.FS(r), "etc/ld.so.conf.d")
	if err != nil || len(ents) != 1 {
		t.Errorf("ReadDir = %v, %v", ents, err)
	}
}

// DriverVersionIn also looks in the root's own library directories, and a
// directory reached twice (merged-/usr's /lib) counts once.
func TestDriverVersionIn(t *testing.T) {
	own := root(t, map[string]string{"/opt/nv/libnvidia-ml.so.535.261.03": ""})
	if _, ok, err := driverroot.DriverVersion(own); ok || err != nil {
		t.Errorf("DriverVersion found a driver outside LibDirs (%v)", err)
	}
	if v, ok, err := driverroot.DriverVersionIn(own, []string{"/opt/nv"}); !ok || err != nil || v.Version != "535.261.03" {
		t.Errorf("DriverVersionIn = %+v, %v, %v; want 535.261.03", v, ok, err)
	}
	merged := root(t, map[string]string{"/lib": "->usr/lib", lib + "/libnvidia-ml.so.550.163.01": ""})
	if v, ok, err := driverroot.DriverVersion(merged); !ok || err != nil || v.Version != "550.163.01" {
		t.Errorf("merged-/usr DriverVersion = %+v, %v, %v; want 550.163.01 once", v, ok, err)
	}
}
