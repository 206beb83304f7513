package nvctk

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/e2e/harness/driverroot"
)

func TestBin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin, err := Bin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"nvidia-ctk", "nvidia-cdi-hook"} {
		out, err := exec.Command(filepath.Join(bin, p), "--version").CombinedOutput()
		if err != nil || !strings.Contains(string(out), strings.TrimPrefix(Version, "v")) {
			t.Errorf("%s --version = %q, %v; want %s", p, out, err, Version)
		}
	}
}

func TestMakeDevRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	dir := t.TempDir()
	if err := MakeDevRoot(dir); err != nil {
		t.Fatal(err)
	}
	if err := MakeDevRoot(dir); err != nil {
		t.Fatalf("second MakeDevRoot: %v", err)
	}
	out, err := exec.Command("stat", "-c", "%n %F %t:%T", filepath.Join(dir, "dev/nvidiactl"), filepath.Join(dir, "dev/nvidia-uvm-tools")).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	// stat prints the numbers in hex: 195 = c3, 255 = ff, 508 = 1fc.
	if !strings.Contains(string(out), "nvidiactl character special file c3:ff") ||
		!strings.Contains(string(out), "nvidia-uvm-tools character special file 1fc:1") {
		t.Errorf("stat:\n%s", out)
	}
}

// spec is the part of a CDI spec the test reads.
type spec struct {
	CDIVersion string `json:"cdiVersion"`
	Kind       string `json:"kind"`
	Devices    []struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	} `json:"devices"`
	ContainerEdits edits `json:"containerEdits"`
}

type edits struct {
	Env         []string `json:"env"`
	DeviceNodes []struct {
		Path, HostPath string
		Major, Minor   int64
	} `json:"deviceNodes"`
	Mounts []struct {
		HostPath      string `json:"hostPath"`
		ContainerPath string `json:"containerPath"`
	} `json:"mounts"`
	Hooks []struct {
		Path string   `json:"path"`
		Args []string `json:"args"`
	} `json:"hooks"`
}

// TestGenerateManagement runs NVIDIA's generator on the real driver root in both
// layouts: the anchor a parity test compares nvinject's spec with.
func TestGenerateManagement(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the dev root needs mknod (root)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	devRoot := t.TempDir()
	if err := MakeDevRoot(devRoot); err != nil {
		t.Fatal(err)
	}
	for _, layout := range driverroot.Layouts() {
		t.Run(layout, func(t *testing.T) {
			root, err := driverroot.Root(ctx, layout)
			if errors.Is(err, driverroot.ErrUnavailable) {
				t.Skipf("no real driver root, so no anchor spec (parity falls back to the simulated root): %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			data, err := GenerateManagement(ctx, root, devRoot, "--format=json")
			if err != nil {
				t.Fatal(err)
			}
			var s spec
			if err := json.Unmarshal(data, &s); err != nil {
				t.Fatalf("spec is not JSON: %v\n%s", err, data)
			}
			if s.Kind != "nvidia.com/gpu" || len(s.Devices) != 1 || s.Devices[0].Name != "all" {
				t.Fatalf("kind %q, devices %+v", s.Kind, s.Devices)
			}
			var nodes []string
			for _, n := range s.Devices[0].ContainerEdits.DeviceNodes {
				nodes = append(nodes, n.Path)
				if n.HostPath != filepath.Join(devRoot, n.Path) {
					t.Errorf("device %s: host path %s, want it under the dev root", n.Path, n.HostPath)
				}
			}
			slices.Sort(nodes)
			if want := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"}; !slices.Equal(nodes, want) {
				t.Errorf("device nodes %v, want %v", nodes, want)
			}
			mounts := map[string]string{}
			for _, m := range s.ContainerEdits.Mounts {
				mounts[m.ContainerPath] = m.HostPath
			}
			libDir := "/" + driverroot.LibDir
			if layout == driverroot.Debian {
				libDir += "/nvidia/current"
			}
			for _, lib := range []string{"libcuda.so.535.261.03", "libnvidia-ml.so.535.261.03", "libnvidia-ptxjitcompiler.so.535.261.03", "libnvidia-nvvm.so.535.261.03"} {
				if host, ok := mounts[libDir+"/"+lib]; !ok || host != root+libDir+"/"+lib {
					t.Errorf("no mount of %s/%s from the root (mounts: %v)", libDir, lib, mounts)
				}
			}
			if _, ok := mounts["/lib/firmware/nvidia/535.261.03/gsp_ga10x.bin"]; !ok {
				t.Error("GSP firmware not mounted")
			}
			var hooks []string
			for _, h := range s.ContainerEdits.Hooks {
				if h.Path != HookPath {
					t.Errorf("hook path %s, want %s", h.Path, HookPath)
				}
				if len(h.Args) > 1 {
					hooks = append(hooks, h.Args[1])
				}
			}
			for _, want := range []string{"create-symlinks", "enable-cuda-compat", "update-ldcache"} {
				if !slices.Contains(hooks, want) {
					t.Errorf("hooks %v lack %s", hooks, want)
				}
			}
			if !slices.Contains(s.ContainerEdits.Env, "NVIDIA_CTK_LIBCUDA_DIR="+strings.Join(libDirs(layout), ":")) {
				t.Errorf("env %v", s.ContainerEdits.Env)
			}
			// Record what NVIDIA's generator finds of the binaries: on the debian layout
			// /usr/bin/nvidia-smi is an absolute link through /etc/alternatives, which
			// v1.20.2 resolves against the host, so it is missing there.
			var bins []string
			for c := range mounts {
				if strings.Contains(c, "bin/") {
					bins = append(bins, c)
				}
			}
			slices.Sort(bins)
			t.Logf("%s layout: cdiVersion %s, %d mounts, binaries %v", layout, s.CDIVersion, len(s.ContainerEdits.Mounts), bins)
		})
	}
}

func libDirs(layout string) []string {
	if layout == driverroot.Debian {
		return []string{"/" + driverroot.LibDir, "/" + driverroot.LibDir + "/nvidia/current"}
	}
	return []string{"/" + driverroot.LibDir}
}
