// Package driverroottest finds a REAL NVIDIA driver root (NVIDIA's user
// space from Debian's archive, no kernel module) for tests, or skips them.
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

// Layouts are the real driver root layouts e2e/driverroot/build.sh makes.
var Layouts = []string{"debian", "flat"}

// Env names the variable holding a ready root of layout
// (NVINJECT_DRIVER_ROOT_DEBIAN, NVINJECT_DRIVER_ROOT_FLAT).
func Env(layout string) string { return "NVINJECT_DRIVER_ROOT_" + strings.ToUpper(layout) }

// unavailable is build.sh's exit status when Debian's archive is unreachable.
const unavailable = 3

// Root returns the real driver root of layout: $NVINJECT_DRIVER_ROOT_<LAYOUT>,
// else what the repository's e2e/driverroot/build.sh prints (it builds and
// caches the root on first use). The test is skipped when neither gives one.
func Root(t testing.TB, layout string) string {
	t.Helper()
	if r := os.Getenv(Env(layout)); r != "" {
		if st, err := os.Stat(r); err != nil || !st.IsDir() {
			t.Fatalf("%s=%s is not a directory; unset it or point it at a driver root", Env(layout), r)
		}
		return r
	}
	script, ok := buildScript()
	if !ok {
		t.Skipf("no real driver root: set %s, or run from a checkout with e2e/driverroot/build.sh", Env(layout))
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

// buildScript finds e2e/driverroot/build.sh above the working directory.
func buildScript() (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		p := filepath.Join(dir, "e2e", "driverroot", "build.sh")
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
