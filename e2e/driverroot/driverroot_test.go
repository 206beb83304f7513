package driverroot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// root builds (or reuses) the real root; an unreachable archive skips, saying why.
func root(t *testing.T, layout string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r, err := Root(ctx, layout)
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

func checkCommon(t *testing.T, r, layout string) {
	manifest, err := os.ReadFile(filepath.Join(r, Manifest))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"real NVIDIA driver user space, no kernel module", "layout " + layout,
		"libcuda1 535.261.03-1 ", "nvidia-persistenced 535.171.04-1~deb12u1 ", "firmware-nvidia-gsp 535.261.03-1 "} {
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
	}
	for _, fw := range []string{"gsp_ga10x.bin", "gsp_tu10x.bin"} {
		if _, err := os.Stat(filepath.Join(r, "lib/firmware/nvidia", DriverVersion, fw)); err != nil {
			t.Error(err)
		}
	}
	// The second call is the cached path: no download, no unpacking.
	start := time.Now()
	again := root(t, layout)
	if again != r {
		t.Errorf("second Root = %s, first %s", again, r)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("cached Root took %v", d)
	}
}

func TestFlat(t *testing.T) {
	r := root(t, Flat)
	checkCommon(t, r, Flat)
	for link, want := range map[string]string{
		LibDir + "/libcuda.so.1":                  "libcuda.so.535.261.03",
		LibDir + "/libcuda.so":                    "libcuda.so.1",
		LibDir + "/libnvidia-ml.so.1":             "libnvidia-ml.so.535.261.03",
		LibDir + "/libnvidia-ptxjitcompiler.so.1": "libnvidia-ptxjitcompiler.so.535.261.03",
		LibDir + "/libnvidia-nvvm.so.4":           "libnvidia-nvvm.so.535.261.03",
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
}

func TestDebian(t *testing.T) {
	r := root(t, Debian)
	checkCommon(t, r, Debian)
	for link, want := range map[string]string{
		LibDir + "/libcuda.so.1":        LibDir + "/nvidia/current/libcuda.so.535.261.03",
		LibDir + "/libcuda.so":          LibDir + "/nvidia/current/libcuda.so.535.261.03",
		LibDir + "/libnvidia-ml.so.1":   LibDir + "/nvidia/current/libnvidia-ml.so.535.261.03",
		LibDir + "/libnvidia-nvvm.so.4": LibDir + "/nvidia/current/libnvidia-nvvm.so.535.261.03",
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
}

func TestUnreachableArchive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs apt-get update against a closed port")
	}
	// An empty cache, so nothing is reused, and a mirror nobody listens on.
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	t.Setenv("NVINJECT_DEBIAN_MIRROR", "http://127.0.0.1:9/debian")
	before := hostAptState(t)
	_, err := Root(context.Background(), Flat)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Root = %v, want ErrUnavailable", err)
	}
	// apt-get update ran with the private configuration only.
	if after := hostAptState(t); after != before {
		t.Errorf("the host's apt state changed:\nbefore %s\nafter  %s", before, after)
	}
	if !strings.Contains(err.Error(), "fix:") {
		t.Errorf("error does not say how to fix it: %v", err)
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

func TestBadLayout(t *testing.T) {
	if _, err := Root(context.Background(), "rpm"); err == nil {
		t.Fatal("Root accepted layout rpm")
	}
}
