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
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/nvinject/nvinject/e2e/internal/cachebuild"
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
var ErrUnavailable = cachebuild.ErrUnavailable

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
	root, err := cachebuild.Run(ctx, script, "build the "+layout+" driver root (e2e/driverroot/build.sh)", log, "--layout", layout)
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("e2e/driverroot/build.sh printed %q, not a path", root)
	}
	if _, err := os.Stat(filepath.Join(root, Manifest)); err != nil {
		return "", fmt.Errorf("driver root %s has no manifest: %w", root, err)
	}
	return root, nil
}
