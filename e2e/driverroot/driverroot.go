// Package driverroot gives tests a driver root holding NVIDIA's REAL driver user space
// (libcuda, NVML, nvidia-smi, firmware; driver 535.261.03 from Debian's archive) and no
// kernel module, built and cached machine-wide by build.sh in this directory.
//
// Without the kernel module the libraries load, cuDriverGetVersion reports 12020,
// cuInit(0) returns 100 (CUDA_ERROR_NO_DEVICE) and nvmlInit returns 9 (Driver Not
// Loaded). When Debian's archive cannot be reached, Root returns an error matching
// ErrUnavailable so a test can fall back to the simulated driver root and say so.
package driverroot

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The layouts build.sh makes.
const (
	// Flat is NVIDIA's .run installer layout: libraries in usr/lib/x86_64-linux-gnu with
	// relative soname links, binaries in usr/bin.
	Flat = "flat"
	// Debian is the layout of Debian's packages: libraries in
	// usr/lib/x86_64-linux-gnu/nvidia/current, public names as absolute links through
	// /etc/alternatives.
	Debian = "debian"
)

// What the root holds and what it reports without a kernel module.
const (
	DriverVersion     = "535.261.03"
	CUDADriverVersion = 12020 // cuDriverGetVersion
	LibDir            = "usr/lib/x86_64-linux-gnu"
	// Manifest is the root-relative file listing the packages, versions and sha256 sums.
	Manifest = "usr/share/nvinject/driver-root.txt"
)

// Layouts lists every layout Root accepts.
func Layouts() []string { return []string{Flat, Debian} }

// ErrUnavailable is matched (errors.Is) by Root's error when Debian's archive cannot be
// reached and the packages are not cached yet.
var ErrUnavailable = errors.New("real NVIDIA driver root unavailable: Debian's archive cannot be reached")

// exitUnavailable is build.sh's exit status for an unreachable archive.
const exitUnavailable = 3

//go:embed build.sh
var script []byte

// Root returns the path of the real driver root in layout (Flat or Debian), building it
// the first time (about 75 MB download; seconds once cached).
func Root(ctx context.Context, layout string) (string, error) {
	return RootWithLog(ctx, layout, nil)
}

// RootWithLog is Root with build.sh's progress lines copied to log (nil: discarded).
func RootWithLog(ctx context.Context, layout string, log io.Writer) (string, error) {
	if layout != Flat && layout != Debian {
		return "", fmt.Errorf("driver root layout %q: want %q or %q", layout, Flat, Debian)
	}
	// The script is embedded so the package works from any directory; its cache key is
	// the hash of its content, the same as when e2e/driverroot/build.sh runs directly.
	dir, err := os.MkdirTemp("", "nvinject-driverroot-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "build.sh")
	if err := os.WriteFile(path, script, 0o755); err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", path, "--layout", layout)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if log != nil {
		cmd.Stderr = io.MultiWriter(&stderr, log)
	}
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.ExitCode() == exitUnavailable:
		return "", fmt.Errorf("%w: %s", ErrUnavailable, lastLines(stderr.String(), 3))
	case err != nil:
		return "", fmt.Errorf("build the %s driver root (e2e/driverroot/build.sh): %w: %s", layout, err, lastLines(stderr.String(), 8))
	}
	root := lastLine(stdout.String())
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("e2e/driverroot/build.sh printed %q, not a path", root)
	}
	if _, err := os.Stat(filepath.Join(root, Manifest)); err != nil {
		return "", fmt.Errorf("driver root %s has no manifest: %w", root, err)
	}
	return root, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
