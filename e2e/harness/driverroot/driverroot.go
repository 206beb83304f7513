// Package driverroot gives tests a driver root holding NVIDIA's REAL driver user space
// (libcuda, NVML, nvidia-smi, firmware) and no kernel module, built and cached
// machine-wide by build.sh in this directory: driver 535.261.03 from Debian 12 bookworm
// (Root) or 550.163.01 from Debian 13 trixie (RootOf), so a node can be upgraded.
//
// Without the kernel module the libraries load, cuDriverGetVersion reports 12020 (535)
// or 12040 (550), cuInit(0) returns 100 (CUDA_ERROR_NO_DEVICE), nvmlInit returns 9
// (Driver Not Loaded) and nvidia-smi -h still prints its version line (SMIVersionLine).
// When Debian's archive cannot be reached, Root returns an error matching
// ErrUnavailable so a test can fall back to the simulated driver root and say so.
package driverroot

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/e2e/internal/cachebuild"
	hostroot "github.com/nvinject/nvinject/shared/driverroot"
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
	// UsrLocal keeps the driver in usr/local/nvidia/{lib64,bin,firmware} with links and a
	// wrapper script at the public names and an ld.so.conf.d entry (a GKE-style host).
	UsrLocal = "usrlocal"
	// GKE is a driver directory and nothing else: lib64/, bin/, firmware/ at the top.
	GKE = "gke"
	// Operator is a GPU Operator driver container's root (/run/nvidia/driver).
	Operator = "operator"
	// RHEL keeps the libraries in usr/lib64.
	RHEL = "rhel"
)

// What the roots hold and what they report without a kernel module.
const (
	DriverVersion     = "535.261.03" // Root's, from bookworm
	CUDADriverVersion = 12020        // cuDriverGetVersion: CUDA 12.2
	// DriverVersion550 is the upgrade, from trixie (merged-/usr: the root has lib -> usr/lib
	// and its firmware in usr/lib/firmware).
	DriverVersion550     = "550.163.01"
	CUDADriverVersion550 = 12040 // cuDriverGetVersion: CUDA 12.4
	LibDir               = "usr/lib/x86_64-linux-gnu"
	// Manifest is the root-relative file listing the packages, versions and sha256 sums.
	Manifest = "usr/share/nvinject/driver-root.txt"
)

// Layouts lists every layout Root accepts.
func Layouts() []string { return []string{Flat, Debian} }

// HostLayouts lists every layout RootOf accepts: Layouts and the real hosts' others.
func HostLayouts() []string { return []string{Debian, Flat, UsrLocal, GKE, Operator, RHEL} }

// Versions lists every driver version RootOf accepts, oldest first.
func Versions() []string { return []string{DriverVersion, DriverVersion550} }

// CUDADriverVersionOf is what cuDriverGetVersion reports for driver version (0 when
// RootOf does not build it).
func CUDADriverVersionOf(version string) int {
	switch version {
	case DriverVersion:
		return CUDADriverVersion
	case DriverVersion550:
		return CUDADriverVersion550
	}
	return 0
}

// ErrUnavailable is matched (errors.Is) by Root's error when Debian's archive cannot be
// reached and the packages are not cached yet.
var ErrUnavailable = cachebuild.ErrUnavailable

//go:embed build.sh
var script []byte

// Root returns the path of the real driver root of DriverVersion in layout (Flat or
// Debian), building it the first time (about 75 MB download; seconds once cached).
func Root(ctx context.Context, layout string) (string, error) {
	return RootWithLog(ctx, layout, nil)
}

// RootWithLog is Root with build.sh's progress lines copied to log (nil: discarded).
func RootWithLog(ctx context.Context, layout string, log io.Writer) (string, error) {
	return RootOfWithLog(ctx, DriverVersion, layout, log)
}

// RootOf is Root for driver version, one of Versions (each its own download and cache).
func RootOf(ctx context.Context, version, layout string) (string, error) {
	return RootOfWithLog(ctx, version, layout, nil)
}

// RootOfWithLog is RootOf with build.sh's progress lines copied to log (nil: discarded).
func RootOfWithLog(ctx context.Context, version, layout string, log io.Writer) (string, error) {
	if !slices.Contains(Versions(), version) {
		return "", fmt.Errorf("driver root version %q: want one of %s", version, strings.Join(Versions(), ", "))
	}
	if !slices.Contains(HostLayouts(), layout) {
		return "", fmt.Errorf("driver root layout %q: want one of %s", layout, strings.Join(HostLayouts(), ", "))
	}
	// --version always: a DRIVER_VERSION in the caller's environment must not pick it.
	root, err := cachebuild.Run(ctx, script, "build the "+version+" "+layout+" driver root (e2e/harness/driverroot/build.sh)", log, "--version", version, "--layout", layout)
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(root) {
		return "", fmt.Errorf("e2e/harness/driverroot/build.sh printed %q, not a path", root)
	}
	manifest := Manifest
	if layout == GKE {
		// A driver directory has no usr/.
		manifest = strings.TrimPrefix(Manifest, "usr/")
	}
	if _, err := os.Stat(filepath.Join(root, manifest)); err != nil {
		return "", fmt.Errorf("driver root %s has no manifest: %w", root, err)
	}
	return root, nil
}

// smiBanner starts the first line of nvidia-smi -h: it is printed without the kernel
// module (exit 0), unlike --version, which needs the driver (exit 9).
const smiBanner = "NVIDIA System Management Interface -- v"

// SMIVersionLine finds the version in real nvidia-smi output holding its banner line,
// "NVIDIA System Management Interface -- v550.163.01" (nvidia-smi -h prints it first).
func SMIVersionLine(output string) (version string, ok bool) {
	for line := range strings.Lines(output) {
		v, found := strings.CutPrefix(strings.TrimSpace(line), smiBanner)
		if found && hostroot.ValidVersion(v) {
			return v, true
		}
	}
	return "", false
}
