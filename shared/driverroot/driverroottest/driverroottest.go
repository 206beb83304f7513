// Package driverroottest finds a REAL NVIDIA driver root (NVIDIA's user
// space from Debian's archive, no kernel module) and NVIDIA's own CDI
// generator, nvidia-ctk, for tests, or skips them.
package driverroottest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Layouts are the real driver root layouts e2e/harness/driverroot/build.sh makes.
var Layouts = []string{"debian", "flat"}

// Env names the variable holding a ready root of layout
// (NVINJECT_DRIVER_ROOT_DEBIAN, NVINJECT_DRIVER_ROOT_FLAT).
func Env(layout string) string { return "NVINJECT_DRIVER_ROOT_" + strings.ToUpper(layout) }

// unavailable is build.sh's exit status when Debian's archive is unreachable.
const unavailable = 3

// Root returns the real driver root of layout: $NVINJECT_DRIVER_ROOT_<LAYOUT>,
// else what the repository's e2e/harness/driverroot/build.sh prints (it builds and
// caches the root on first use). The test is skipped when neither gives one.
func Root(t testing.TB, layout string) string {
	t.Helper()
	if r := os.Getenv(Env(layout)); r != "" {
		if st, err := os.Stat(r); err != nil || !st.IsDir() {
			t.Fatalf("%s=%s is not a directory; unset it or point it at a driver root", Env(layout), r)
		}
		return r
	}
	script, ok := findScript("e2e/harness/driverroot/build.sh")
	if !ok {
		t.Skipf("no real driver root: set %s, or run from a checkout with e2e/harness/driverroot/build.sh", Env(layout))
	}
	cmd := exec.Command(script, "--layout", layout)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == unavailable {
		t.Skipf("no real driver root: Debian's archive is unreachable (%s): %s", script, lastLine(stderr.Bytes()))
	}
	if err != nil {
		t.Fatalf("%s --layout %s: %v\n%s", script, layout, err, stderr.Bytes())
	}
	return lastLine(out)
}

// NVCTKVersion is the nvidia-ctk release the parity test compares with.
const NVCTKVersion = "v1.20.2"

// NVCTK returns the path of nvidia-ctk NVCTKVersion: what the repository's
// e2e/harness/nvctk/build.sh prints (it builds and caches it), else the machine-wide
// cache it fills, else built into that cache with `go install` from the Go
// module proxy. The test is skipped when none works.
func NVCTK(t testing.TB) string {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no nvidia-ctk: no cache directory: %v", err)
	}
	bin := filepath.Join(cache, "nvinject", "nvidia-ctk-"+NVCTKVersion, "bin")
	if script, ok := findScript("e2e/harness/nvctk/build.sh"); ok {
		var stderr bytes.Buffer
		cmd := exec.Command(script)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", script, err, stderr.Bytes())
		}
		bin = lastLine(out)
	} else if _, err := os.Stat(filepath.Join(bin, "nvidia-ctk")); err != nil {
		cmd := exec.Command("go", "install", "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk@"+NVCTKVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=", "GOWORK=off", "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Skipf("no nvidia-ctk: go install nvidia-ctk@%s failed (is the Go module proxy reachable?): %v\n%s", NVCTKVersion, err, out)
		}
	}
	return filepath.Join(bin, "nvidia-ctk")
}

// findScript finds rel (a path from the repository's top) above the
// working directory.
func findScript(rel string) (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
