package driverroot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// root builds (or reuses) the real 535 root; an unreachable archive skips, saying why.
func root(t *testing.T, layout string) string {
	t.Helper()
	return rootOf(t, DriverVersion, layout)
}

// rootOf is root for driver version.
func rootOf(t *testing.T, version, layout string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r, err := RootOf(ctx, version, layout)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("no real driver root (a test using it would fall back to the simulated root): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// resolve follows symlinks the way the root's own loader would: absolute targets are
// resolved against the root, not the host.
func resolve(t *testing.T, r, p string) string {
	t.Helper()
	for range 16 {
		fi, err := os.Lstat(filepath.Join(r, p))
		if err != nil {
			t.Fatalf("%s in root: %v", p, err)
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return p
		}
		target, err := os.Readlink(filepath.Join(r, p))
		if err != nil {
			t.Fatal(err)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join("/", filepath.Dir(p), target)
		}
		p = target
	}
	t.Fatalf("%s: too many links", p)
	return ""
}

func cachedLibs(t *testing.T, r string) string {
	t.Helper()
	out, err := exec.Command("ldconfig", "-p", "-C", filepath.Join(r, "etc/ld.so.cache")).CombinedOutput()
	if err != nil {
		t.Fatalf("ldconfig -p: %v: %s", err, out)
	}
	return string(out)
}

// debs are the Debian package versions each driver version's root is unpacked from.
var debs = map[string]struct{ driver, persistenced string }{
	DriverVersion:    {"535.261.03-1", "535.171.04-1~deb12u1"},
	DriverVersion550: {"550.163.01-2", "550.163.01-1"},
}

// forEachVersion runs check on the root of every version in layout.
func forEachVersion(t *testing.T, layout string, check func(t *testing.T, r, version string)) {
	for _, v := range Versions() {
		t.Run(v, func(t *testing.T) { check(t, rootOf(t, v, layout), v) })
	}
}

func checkCommon(t *testing.T, r, version, layout string) {
	manifest, err := os.ReadFile(filepath.Join(r, Manifest))
	if err != nil {
		t.Fatal(err)
	}
	deb := debs[version]
	for _, want := range []string{"real NVIDIA driver user space, no kernel module", "NVIDIA driver " + version + ", layout " + layout,
		"libcuda1 " + deb.driver + " ", "nvidia-persistenced " + deb.persistenced + " ", "firmware-nvidia-gsp " + deb.driver + " "} {
		if !strings.Contains(string(manifest), want) {
			t.Errorf("manifest lacks %q:\n%s", want, manifest)
		}
	}
	libs := cachedLibs(t, r)
	for _, soname := range []string{"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"} {
		want := soname + " (libc6,x86-64) => /" + LibDir + "/" + soname
		if !strings.Contains(libs, want) {
			t.Errorf("ld.so.cache lacks %q:\n%s", want, libs)
		}
		// What the cache names resolves to this version's library file inside the root.
		want = "/" + soname[:strings.Index(soname, ".so")] + ".so." + version
		if got := resolve(t, r, "/"+LibDir+"/"+soname); !strings.HasSuffix(got, want) {
			t.Errorf("%s resolves in the root to %s, want *%s", soname, got, want)
		}
	}
	// Where a host has it: /lib/firmware/nvidia/<version>/, through trixie's lib -> usr/lib.
	for _, fw := range []string{"gsp_ga10x.bin", "gsp_tu10x.bin"} {
		if _, err := os.Stat(filepath.Join(r, "lib/firmware/nvidia", version, fw)); err != nil {
			t.Error(err)
		}
	}
	lib, err := os.Readlink(filepath.Join(r, "lib"))
	if merged := version != DriverVersion; merged && (err != nil || lib != "usr/lib") {
		t.Errorf("lib -> %q (%v), want usr/lib as on a merged-/usr trixie host", lib, err)
	} else if !merged && err == nil {
		t.Errorf("lib -> %q, want bookworm's directory", lib)
	}
	// The second call is the cached path: no download, no unpacking.
	start := time.Now()
	again := rootOf(t, version, layout)
	if again != r {
		t.Errorf("second RootOf = %s, first %s", again, r)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("cached RootOf took %v", d)
	}
}

func TestFlat(t *testing.T) {
	forEachVersion(t, Flat, func(t *testing.T, r, version string) {
		checkCommon(t, r, version, Flat)
		for link, want := range map[string]string{
			LibDir + "/libcuda.so.1":                  "libcuda.so." + version,
			LibDir + "/libcuda.so":                    "libcuda.so.1",
			LibDir + "/libnvidia-ml.so.1":             "libnvidia-ml.so." + version,
			LibDir + "/libnvidia-ptxjitcompiler.so.1": "libnvidia-ptxjitcompiler.so." + version,
			LibDir + "/libnvidia-nvvm.so.4":           "libnvidia-nvvm.so." + version,
		} {
			got, err := os.Readlink(filepath.Join(r, link))
			if err != nil || got != want {
				t.Errorf("%s -> %q (%v), want relative %q", link, got, err, want)
			}
		}
		for _, bin := range []string{"nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-persistenced"} {
			fi, err := os.Lstat(filepath.Join(r, "usr/bin", bin))
			if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
				t.Errorf("usr/bin/%s: %v, %v; want an executable file", bin, fi, err)
			}
		}
	})
}

func TestDebian(t *testing.T) {
	forEachVersion(t, Debian, func(t *testing.T, r, version string) {
		checkCommon(t, r, version, Debian)
		for link, want := range map[string]string{
			LibDir + "/libcuda.so.1":        LibDir + "/nvidia/current/libcuda.so." + version,
			LibDir + "/libcuda.so":          LibDir + "/nvidia/current/libcuda.so." + version,
			LibDir + "/libnvidia-ml.so.1":   LibDir + "/nvidia/current/libnvidia-ml.so." + version,
			LibDir + "/libnvidia-nvvm.so.4": LibDir + "/nvidia/current/libnvidia-nvvm.so." + version,
			"usr/bin/nvidia-smi":            "usr/lib/nvidia/current/nvidia-smi",
		} {
			target, err := os.Readlink(filepath.Join(r, link))
			if err != nil || !strings.HasPrefix(target, "/etc/alternatives/nvidia--") {
				t.Errorf("%s -> %q (%v), want an absolute link through /etc/alternatives", link, target, err)
				continue
			}
			if got := resolve(t, r, "/"+link); got != "/"+want {
				t.Errorf("%s resolves in the root to %s, want /%s", link, got, want)
			}
		}
		if got := resolve(t, r, "/usr/lib/nvidia/nvidia"); got != "/usr/lib/nvidia/current" {
			t.Errorf("the nvidia alternative's master link resolves to %s", got)
		}
		if _, err := os.Stat(filepath.Join(r, "usr/sbin/nvidia-cuda-mps-server")); err != nil {
			t.Error(err)
		}
	})
}

// smi runs the root's real nvidia-smi with args, its libraries through LD_LIBRARY_PATH
// (the debian layout's links are absolute, so its binary and library dirs are used).
func smi(t *testing.T, r, layout string, args ...string) (string, int) {
	t.Helper()
	bin, libs := filepath.Join(r, "usr/bin/nvidia-smi"), filepath.Join(r, LibDir)
	if layout == Debian {
		bin = filepath.Join(r, resolve(t, r, "/usr/bin/nvidia-smi"))
		libs = filepath.Join(r, LibDir, "nvidia/current") + ":" + libs
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libs)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("nvidia-smi: %v", err)
	}
	return string(out), cmd.ProcessState.ExitCode()
}

// Without the kernel module the real nvidia-smi still names its own version in -h's
// first line (exit 0); --version and a plain run need the driver (exit 9).
func TestSMIVersion(t *testing.T) {
	for _, layout := range Layouts() {
		t.Run(layout, func(t *testing.T) {
			forEachVersion(t, layout, func(t *testing.T, r, version string) {
				out, code := smi(t, r, layout, "-h")
				if got, ok := SMIVersionLine(out); code != 0 || !ok || got != version {
					t.Errorf("nvidia-smi -h: exit %d, version %q %v; want 0, %q:\n%.300s", code, got, ok, version, out)
				}
				for _, args := range [][]string{{"--version"}, {}} {
					out, code := smi(t, r, layout, args...)
					if code != 9 || !strings.Contains(out, "couldn't communicate with the NVIDIA driver") {
						t.Errorf("nvidia-smi %v: exit %d, want 9, no driver:\n%s", args, code, out)
					}
				}
			})
		})
	}
}

func TestSMIVersionLine(t *testing.T) {
	for _, tc := range []struct {
		name, out, want string
		ok              bool
	}{
		{"535 -h", "NVIDIA System Management Interface -- v535.261.03\n\nNVSMI provides monitoring information for Tesla and select Quadro devices.\n", "535.261.03", true},
		{"550 -h", "NVIDIA System Management Interface -- v550.163.01\n\n", "550.163.01", true},
		{"after other lines, CRLF", "warning\r\nNVIDIA System Management Interface -- v550.54\r\n", "550.54", true},
		{"no driver", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n", "", false},
		{"not a version", "NVIDIA System Management Interface -- vNEXT\n", "", false},
		{"simulated", "[SIMULATED] NVIDIA System Management Interface -- v535.261.03\n", "", false},
		{"empty", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, ok := SMIVersionLine(tc.out); got != tc.want || ok != tc.ok {
				t.Errorf("SMIVersionLine = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// NVIDIA's libraries of each version, dlopened by e2e/cmd/gpu-probe through
// LD_LIBRARY_PATH into the flat root, report that version's CUDA driver API.
func TestCUDADriverVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds e2e/cmd/gpu-probe with cgo")
	}
	probe := filepath.Join(t.TempDir(), "gpu-probe")
	if out, err := exec.Command("go", "build", "-o", probe, "../../cmd/gpu-probe").CombinedOutput(); err != nil {
		t.Fatalf("go build gpu-probe: %v\n%s", err, out)
	}
	forEachVersion(t, Flat, func(t *testing.T, r, version string) {
		cmd := exec.Command(probe, "--json")
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(r, LibDir))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("gpu-probe: %v\n%s", err, out)
		}
		var report struct {
			Libraries []struct{ Name, RealPath string }
			Calls     []struct {
				Call, Name string
				Code       int
				Value      *int
			}
		}
		if err := json.Unmarshal(out, &report); err != nil {
			t.Fatalf("gpu-probe --json: %v\n%s", err, out)
		}
		for _, l := range report.Libraries {
			if !strings.HasSuffix(l.RealPath, ".so."+version) {
				t.Errorf("%s loaded from %s, want this root's *.so.%s", l.Name, l.RealPath, version)
			}
		}
		type result struct{ code, value int }
		want := map[string]result{"cuDriverGetVersion": {0, CUDADriverVersionOf(version)}, "cuInit(0)": {100, 0}, "nvmlInit": {9, 0}}
		for _, c := range report.Calls {
			got := result{code: c.Code}
			if c.Value != nil {
				got.value = *c.Value
			}
			if w, ok := want[c.Call]; ok && got != w {
				t.Errorf("%s = %+v (%s), want %+v", c.Call, got, c.Name, w)
			}
			delete(want, c.Call)
		}
		if len(want) > 0 {
			t.Errorf("gpu-probe made no calls %v", want)
		}
	})
}

func TestUnreachableArchive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs apt-get update against a closed port")
	}
	// An empty cache, so nothing is reused, and a mirror nobody listens on.
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("NVINJECT_DEBIAN_MIRROR", "http://127.0.0.1:9/debian")
	for _, v := range Versions() {
		before := hostAptState(t)
		_, err := RootOf(context.Background(), v, Flat)
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("RootOf %s = %v, want ErrUnavailable", v, err)
		}
		// apt-get update ran with the private configuration only.
		if after := hostAptState(t); after != before {
			t.Errorf("%s: the host's apt state changed:\nbefore %s\nafter  %s", v, before, after)
		}
		if !strings.Contains(err.Error(), "fix:") {
			t.Errorf("%s: error does not say how to fix it: %v", v, err)
		}
	}
}

// hostAptState summarizes the host's apt lists and caches (names, sizes, mtimes).
func hostAptState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, dir := range []string{"/var/lib/apt/lists", "/var/cache/apt"} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if fi, err := e.Info(); err == nil {
				fmt.Fprintf(&b, "%s/%s:%d:%d ", dir, e.Name(), fi.Size(), fi.ModTime().UnixNano())
			}
		}
	}
	return b.String()
}

func TestBadArguments(t *testing.T) {
	if _, err := Root(context.Background(), "rpm"); err == nil {
		t.Error("Root accepted layout rpm")
	}
	if _, err := RootOf(context.Background(), "580.95.05", Flat); err == nil || !strings.Contains(err.Error(), DriverVersion550) {
		t.Errorf("RootOf 580.95.05 = %v, want an error naming the versions", err)
	}
	if got := CUDADriverVersionOf("580.95.05"); got != 0 {
		t.Errorf("CUDADriverVersionOf(580.95.05) = %d, want 0", got)
	}
}
