package driver_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/cdi/driver"
	"github.com/nvinject/nvinject/cdi/simulation/simtest"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

const lib = "/usr/lib/x86_64-linux-gnu"

func write(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, mode); err != nil {
		t.Fatal(err)
	}
}

func listen(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Skipf("unix socket %s: %v", p, err)
	}
	t.Cleanup(func() { l.Close() })
}

// Find takes every *.so.<version> of the driver's directories, not a fixed
// list, and the binaries, firmware files and IPC paths that exist.
func TestFind(t *testing.T) {
	dir, err := os.MkdirTemp("", "drv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	simtest.DriverRoot(t, "sim:a100-80gb", dir)
	root := filepath.Join(dir, "driver-root")
	v := sim.DriverVersion
	write(t, filepath.Join(root, lib, "libnvidia-encode.so."+v), 0o644) // not in ld.so.cache
	write(t, filepath.Join(root, lib, "vdpau/libvdpau_nvidia.so."+v), 0o644)
	write(t, filepath.Join(root, lib, "libnvidia-ml.so.470.256.02"), 0o644) // a stale driver's
	write(t, filepath.Join(root, "usr/sbin/nvidia-cuda-mps-server"), 0o755)
	write(t, filepath.Join(root, "usr/bin/nvidia-debugdump"), 0o644) // not executable
	write(t, filepath.Join(root, "lib/firmware/nvidia", v, "README"), 0o644)
	listen(t, filepath.Join(root, "run/nvidia-persistenced/socket"))
	listen(t, filepath.Join(root, "var/run/nvidia-fabricmanager/socket"))
	if err := os.MkdirAll(filepath.Join(root, "tmp/nvidia-mps"), 0o755); err != nil {
		t.Fatal(err)
	}

	f, err := driver.Find(root, v, "NVML")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, l := range f.Libraries {
		files = append(files, filepath.Base(l.File))
	}
	for _, want := range []string{"libcuda.so." + v, "libnvidia-ml.so." + v, "libnvidia-encode.so." + v, "libvdpau_nvidia.so." + v} {
		if !slices.Contains(files, want) {
			t.Errorf("libraries %v lack %s", files, want)
		}
	}
	if slices.Contains(files, "libnvidia-ml.so.470.256.02") {
		t.Errorf("a stale driver's library was taken: %v", files)
	}
	for _, l := range f.Libraries {
		switch filepath.Base(l.File) {
		case "libcuda.so." + v:
			if l.Soname != "libcuda.so.1" || l.DevLink != "libcuda.so" {
				t.Errorf("libcuda: %+v", l)
			}
		case "libnvidia-nvvm.so." + v:
			if l.Soname != "libnvidia-nvvm.so.4" {
				t.Errorf("libnvidia-nvvm: %+v", l)
			}
		}
	}
	bins := map[string]string{}
	for _, b := range f.Binaries {
		bins[b.Path] = b.Source
	}
	if _, ok := bins["/usr/sbin/nvidia-cuda-mps-server"]; !ok || len(bins) != 2 {
		t.Errorf("binaries = %v; want nvidia-smi and /usr/sbin/nvidia-cuda-mps-server, not the non-executable debugdump", bins)
	}
	var fw []string
	for _, x := range f.Firmware {
		fw = append(fw, x.Path)
	}
	if !slices.Equal(fw, []string{"/lib/firmware/nvidia/" + v + "/gsp_ga10x.bin", "/lib/firmware/nvidia/" + v + "/gsp_tu10x.bin"}) {
		t.Errorf("firmware = %v; want the gsp files only", fw)
	}
	var ipc []string
	for _, x := range f.IPC {
		ipc = append(ipc, x.Path)
	}
	if !slices.Equal(ipc, []string{driver.PersistencedSocket, "/var/run/nvidia-fabricmanager/socket", driver.MPSPipeDir}) {
		t.Errorf("IPC = %v", ipc)
	}
	if !slices.Equal(f.LibDirs(), []string{lib, lib + "/vdpau"}) {
		t.Errorf("LibDirs = %v", f.LibDirs())
	}
}

func TestFindRefuses(t *testing.T) {
	dir := t.TempDir()
	simtest.DriverRoot(t, "sim:a100-80gb", dir)
	root := filepath.Join(dir, "driver-root")
	empty := t.TempDir()
	for _, tc := range []struct {
		name, root, version, source, want string
		is                                error
	}{
		{"mismatch, real", root, "535.261.03", "NVML", "NVML reports 535.261.03 (NVML) but the driver root " + root + " holds " + sim.DriverVersion, driver.ErrVersionMismatch},
		{"mismatch, simulated", root, "535.261.03", "SIMULATED, the driver= option of sim:a100-80gb,driver=535.261.03", "pass --nvml=sim:<model>,driver=" + sim.DriverVersion, driver.ErrVersionMismatch},
		{"no driver", empty, sim.DriverVersion, "NVML", "holds no NVIDIA driver", nil},
		{"no root", filepath.Join(empty, "x"), sim.DriverVersion, "NVML", "--driver-root", driver.ErrNoDriverRoot},
		{"no version", root, "", "NVML", "NVML did not report one", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := driver.Find(tc.root, tc.version, tc.source)
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("err = %v; want %q", err, tc.want)
			}
		})
	}
}
