package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/e2e/harness/bookworm"
	"github.com/nvinject/nvinject/e2e/harness/driverroot"
)

// buildProbe builds this command once per test binary.
func buildProbe(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gpu-probe")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func realRoot(t *testing.T, layout string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r, err := driverroot.Root(ctx, layout)
	if errors.Is(err, driverroot.ErrUnavailable) {
		t.Skipf("no real driver root, nothing to probe (the simulated root has no real libcuda): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run runs the probe with --json (and once without, logged) and decodes its report.
func run(t *testing.T, cmd func(args ...string) *exec.Cmd) (Report, int) {
	t.Helper()
	text, _ := cmd().CombinedOutput()
	t.Logf("gpu-probe:\n%s", text)
	out, err := cmd("--json").Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	return r, code
}

// checkNoKernelModule asserts what the real user space gives without its kernel
// module: everything loads from libDir, CUDA 12.2, no device, NVML driver not loaded.
func checkNoKernelModule(t *testing.T, r Report, code int, libDir string) {
	t.Helper()
	if code != 0 || !r.AllLoaded {
		t.Fatalf("exit %d, report %+v; want every library loaded", code, r)
	}
	for _, l := range r.Libraries {
		want := ".so." + driverroot.DriverVersion
		if !strings.HasPrefix(l.RealPath, libDir+"/") || !strings.HasSuffix(l.RealPath, want) {
			t.Errorf("%s loaded from %s, want %s/*%s", l.Name, l.RealPath, libDir, want)
		}
	}
	calls := map[string]Call{}
	for _, c := range r.Calls {
		calls[c.Call] = c
	}
	if c := calls["cuDriverGetVersion"]; c.Code != 0 || c.Value == nil || *c.Value != driverroot.CUDADriverVersion {
		t.Errorf("cuDriverGetVersion = %+v, want %d", c, driverroot.CUDADriverVersion)
	}
	if c := calls["cuInit(0)"]; c.Code != 100 || c.Name != "CUDA_ERROR_NO_DEVICE" {
		t.Errorf("cuInit(0) = %+v, want 100 CUDA_ERROR_NO_DEVICE", c)
	}
	if c := calls["nvmlInit"]; c.Code != 9 || c.Name != "Driver Not Loaded" {
		t.Errorf("nvmlInit = %+v, want 9 Driver Not Loaded", c)
	}
}

// The flat root's libraries straight from the host through LD_LIBRARY_PATH (the debian
// layout's absolute /etc/alternatives links need a chroot, see TestChroot).
func TestFlatRootLDLibraryPath(t *testing.T) {
	probe := buildProbe(t)
	root := realRoot(t, driverroot.Flat)
	libDir := filepath.Join(root, driverroot.LibDir)
	r, code := run(t, func(args ...string) *exec.Cmd {
		c := exec.Command(probe, args...)
		c.Env = append(os.Environ(), "LD_LIBRARY_PATH="+libDir)
		return c
	})
	checkNoKernelModule(t, r, code, libDir)
}

// A library missing: exit 1, naming it with dlerror's text, the rest still probed.
func TestMissingLibrary(t *testing.T) {
	if out, _ := exec.Command("ldconfig", "-p").Output(); strings.Contains(string(out), "libnvidia-nvvm.so.4") {
		t.Skip("this host has libnvidia-nvvm.so.4 installed")
	}
	probe := buildProbe(t)
	root := realRoot(t, driverroot.Flat)
	// Every library of the flat root but NVVM.
	dir := t.TempDir()
	entries, err := os.ReadDir(filepath.Join(root, driverroot.LibDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "libnvidia-nvvm.") {
			continue
		}
		if err := os.Symlink(filepath.Join(root, driverroot.LibDir, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	r, code := run(t, func(args ...string) *exec.Cmd {
		c := exec.Command(probe, args...)
		c.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir)
		return c
	})
	if code != 1 || r.AllLoaded {
		t.Fatalf("exit %d, all_loaded %v; want 1, false", code, r.AllLoaded)
	}
	for _, l := range r.Libraries {
		if l.Name == "libnvidia-nvvm.so.4" {
			if l.OK || !strings.Contains(l.Error, "libnvidia-nvvm.so.4: cannot open shared object file") {
				t.Errorf("nvvm = %+v, want the dlerror text", l)
			}
		} else if !l.OK {
			t.Errorf("%s failed: %s", l.Name, l.Error)
		}
	}
	if text, _ := exec.Command(probe).CombinedOutput(); !strings.Contains(string(text), "dlopen libnvidia-nvvm.so.4: FAILED: ") {
		t.Errorf("text output does not name the failure:\n%s", text)
	}
}

// Both layouts merged into the bookworm rootfs, the way a container sees the driver:
// the loader finds the libraries through the chroot's own ld.so.cache.
func TestChroot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot needs root")
	}
	probe := buildProbe(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rootfs, err := bookworm.Rootfs(ctx)
	if errors.Is(err, bookworm.ErrUnavailable) {
		t.Skipf("no bookworm rootfs: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	probeTree := t.TempDir()
	if err := os.MkdirAll(filepath.Join(probeTree, "usr/local/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", probe, filepath.Join(probeTree, "usr/local/bin/gpu-probe")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	for _, layout := range driverroot.Layouts() {
		t.Run(layout, func(t *testing.T) {
			root := realRoot(t, layout)
			dir := filepath.Join(t.TempDir(), "root")
			if err := bookworm.Unpack(ctx, rootfs, dir, root, probeTree); err != nil {
				t.Fatal(err)
			}
			libDir := "/" + driverroot.LibDir
			if layout == driverroot.Debian {
				libDir += "/nvidia/current"
			}
			r, code := run(t, func(args ...string) *exec.Cmd {
				// A private /proc, as a container has one.
				return exec.Command("unshare", append([]string{"--mount", "--pid", "--fork",
					"--mount-proc=" + filepath.Join(dir, "proc"), "chroot", dir, "/usr/local/bin/gpu-probe"}, args...)...)
			})
			checkNoKernelModule(t, r, code, libDir)
			smi, err := exec.Command("chroot", dir, "/usr/bin/nvidia-smi").CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 9 || !strings.Contains(string(smi), "couldn't communicate with the NVIDIA driver") {
				t.Errorf("nvidia-smi: %v\n%s\nwant exit 9, no driver", err, smi)
			}
		})
	}
}
