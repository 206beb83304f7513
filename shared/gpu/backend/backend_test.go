package backend_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/driverroot"
	"github.com/nvinject/nvinject/shared/driverroot/driverroottest"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// This machine has no NVIDIA driver: the real backend must say so and
// what to check, the first row of the GPU troubleshooting table.
//
// It runs in a process of its own: once a test here loaded a driver root's
// libnvidia-ml.so.1 (and its nvmlInit failed), go-nvml offers no way to
// unload it, and the dynamic loader then answers the host's
// libnvidia-ml.so.1 with it by soname.
func TestRealWithoutDriver(t *testing.T) {
	if os.Getenv(freshProcess) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRealWithoutDriver$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), freshProcess+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- ") {
			t.Fatalf("in a fresh process: %v\n%s", err, out)
		}
		if strings.Contains(string(out), "--- SKIP") {
			t.Skip(string(out))
		}
		return
	}
	_, err := backend.Open(backend.Real, backend.Options{DriverRoot: t.TempDir()})
	if err == nil {
		t.Skip("an NVIDIA driver is installed here")
	}
	if !errors.Is(err, nvmlinv.ErrLibraryNotFound) {
		t.Fatalf("err = %v, want ErrLibraryNotFound", err)
	}
	for _, hint := range []string{"nvidia-smi", "--driver-root", "sim:a100-80gb"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("error lacks hint %q: %v", hint, err)
		}
	}
}

// freshProcess marks the child process TestRealWithoutDriver runs in.
const freshProcess = "NVINJECT_BACKEND_TEST_FRESH_PROCESS"

func TestOpenRejects(t *testing.T) {
	for _, v := range []string{"nvml", "sim:", "sim:a100-80gb*99"} {
		if _, err := backend.Open(v, backend.Options{}); err == nil {
			t.Errorf("%q accepted", v)
		}
	}
}

// On a real driver root (NVIDIA's user space without the kernel module),
// real NVML loads the ROOT's libnvidia-ml.so.1, found through the Debian
// layout's absolute /etc/alternatives links inside the root, and then
// reports Driver Not Loaded with the kernel-module checks.
func TestRealDriverRootWithoutKernelModule(t *testing.T) {
	for _, layout := range driverroottest.Layouts {
		t.Run(layout, func(t *testing.T) {
			root := driverroottest.Root(t, layout)
			if _, err := os.Stat("/sys/module/nvidia"); err == nil {
				t.Skip("this machine has an NVIDIA kernel module loaded")
			}
			_, err := backend.Open(backend.Real, backend.Options{DriverRoot: root})
			if !errors.Is(err, nvmlinv.ErrDriverNotLoaded) {
				t.Fatalf("err = %v, want ErrDriverNotLoaded (the root's NVML loaded, the kernel module is absent)", err)
			}
			lib := driverroot.FindLibrary(root, "libnvidia-ml.so.1")
			if !strings.HasPrefix(lib, root) || !strings.HasSuffix(lib, ".so.535.261.03") {
				t.Fatalf("the root's NVML is %q, not a file of the root", lib)
			}
			for _, hint := range []string{"lsmod | grep nvidia", "/dev/nvidiactl", lib} {
				if !strings.Contains(err.Error(), hint) {
					t.Errorf("error lacks %q: %v", hint, err)
				}
			}
		})
	}
}

// The simulation reports the driver of the root it is given; driver=
// overrides it; a root without a driver keeps the default.
func TestSimFollowsDriverRoot(t *testing.T) {
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libnvidia-ml.so.535.261.03"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.261.03", filepath.Join(lib, "libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		value, root, driver, cuda, source string
	}{
		{"sim:a100-80gb", root, "535.261.03", "12.2", "following the driver root " + root + ": /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.261.03"},
		{"sim:a100-80gb,driver=550.54.15", root, "550.54.15", "12.4", "driver="},
		{"sim:a100-80gb", t.TempDir(), sim.DriverVersion, "13.0", "sim:a100-80gb default"},
		{"sim:a100-80gb", "", sim.DriverVersion, "13.0", "sim:a100-80gb default"},
	} {
		b, err := backend.Open(tc.value, backend.Options{DriverRoot: tc.root})
		if err != nil {
			t.Fatal(err)
		}
		node, err := b.Discover(context.Background())
		b.Close()
		if err != nil {
			t.Fatal(err)
		}
		if node.DriverVersion != tc.driver || node.CUDAVersion != tc.cuda || !strings.Contains(node.DriverSource, tc.source) || !strings.Contains(node.DriverSource, "SIMULATED") {
			t.Errorf("%s on %q: driver %s CUDA %s source %q; want %s, %s, %q", tc.value, tc.root, node.DriverVersion, node.CUDAVersion, node.DriverSource, tc.driver, tc.cuda, tc.source)
		}
	}
}
