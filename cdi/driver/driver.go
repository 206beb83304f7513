// Package driver finds an NVIDIA driver's user-space files under a driver
// root: its versioned libraries (through the root's ld.so.cache), its
// binaries, firmware and the persistenced socket.
package driver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/cdi/ldcache"
)

// Libraries are the driver libraries a compute or monitoring workload
// needs (the "compute" and "utility" capabilities of NVIDIA's toolkit).
var Libraries = []string{
	"libcuda", "libcudadebugger", "libnvidia-allocator", "libnvidia-cfg",
	"libnvidia-gpucomp", "libnvidia-ml", "libnvidia-nscq", "libnvidia-nvvm",
	"libnvidia-opencl", "libnvidia-pkcs11", "libnvidia-pkcs11-openssl3",
	"libnvidia-ptxjitcompiler",
}

// Binaries are the driver's command-line tools.
var Binaries = []string{
	"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
	"nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
}

// PersistencedSocket is where nvidia-persistenced listens.
const PersistencedSocket = "/run/nvidia-persistenced/socket"

// SimulatedFacts is the facts file of a SIMULATED driver root (see the
// simroot package); real driver roots do not have it.
const SimulatedFacts = "/usr/share/nvinject/simulated-gpus.json"

// Library is one driver library: the versioned file and the soname link
// the loader resolves, both as paths inside the driver root.
type Library struct {
	Soname string
	Link   string
	File   string
}

// Files are the driver files to put into a container, as absolute paths
// relative to the driver root.
type Files struct {
	Libraries          []Library
	Binaries           []string
	Firmware           string
	PersistencedSocket string
	SimulatedFacts     string
}

// ErrNoDriverRoot is returned when the driver root does not exist.
var ErrNoDriverRoot = errors.New("driver root not found")

// Find returns the files of driver version under root.
func Find(root, version string) (Files, error) {
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		return Files{}, fmt.Errorf("%w: %s is not a directory; point --driver-root at the directory holding the driver install (/ on a host install, /run/nvidia/driver for the GPU Operator's driver container)", ErrNoDriverRoot, root)
	}
	if version == "" {
		return Files{}, errors.New("driver version is empty; NVML did not report one")
	}
	libs, err := findLibraries(root, version)
	if err != nil {
		return Files{}, err
	}
	f := Files{Libraries: libs}
	for _, b := range Binaries {
		for _, dir := range []string{"/usr/bin", "/bin", "/usr/local/bin"} {
			if isFile(filepath.Join(root, dir, b)) {
				f.Binaries = append(f.Binaries, path.Join(dir, b))
				break
			}
		}
	}
	for _, dir := range []string{"/lib/firmware/nvidia", "/usr/lib/firmware/nvidia"} {
		fw := path.Join(dir, version)
		if st, err := os.Stat(filepath.Join(root, fw)); err == nil && st.IsDir() {
			f.Firmware = fw
			break
		}
	}
	if st, err := os.Stat(filepath.Join(root, PersistencedSocket)); err == nil && st.Mode().Type() == fs.ModeSocket {
		f.PersistencedSocket = PersistencedSocket
	}
	if isFile(filepath.Join(root, SimulatedFacts)) {
		f.SimulatedFacts = SimulatedFacts
	}
	return f, nil
}

func findLibraries(root, version string) ([]Library, error) {
	cachePath := filepath.Join(root, "etc/ld.so.cache")
	data, err := os.ReadFile(cachePath)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w; run `ldconfig -r %s` (or ldconfig inside the driver container) so the driver's libraries are indexed", cachePath, err, root)
	}
	entries, err := ldcache.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w; regenerate it with `ldconfig -r %s`", cachePath, err, root)
	}
	arch := archFlag()
	var out []Library
	for _, e := range entries {
		if e.Arch() != arch {
			continue
		}
		base, _, ok := strings.Cut(e.Name, ".so")
		if !ok || !slices.Contains(Libraries, base) || slices.ContainsFunc(out, func(l Library) bool { return l.Soname == e.Name }) {
			continue
		}
		file, err := resolve(root, e.Path)
		if err != nil {
			continue
		}
		// A library of another driver version is a stale leftover, not ours.
		if path.Base(file) != base+".so."+version {
			continue
		}
		out = append(out, Library{Soname: e.Name, Link: e.Path, File: file})
	}
	if !slices.ContainsFunc(out, func(l Library) bool { return strings.HasPrefix(l.Soname, "libnvidia-ml.so") }) {
		return nil, fmt.Errorf("libnvidia-ml.so.%s is not in %s: the driver root does not hold the running driver's libraries (version %s); check --driver-root and rerun ldconfig there", version, cachePath, version)
	}
	return out, nil
}

// resolve follows symlinks of p inside root, returning the path relative
// to root.
func resolve(root, p string) (string, error) {
	cur := p
	for range 16 {
		fi, err := os.Lstat(filepath.Join(root, cur))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return cur, nil
		}
		target, err := os.Readlink(filepath.Join(root, cur))
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(cur), target)
		}
		cur = path.Clean(target)
	}
	return "", fmt.Errorf("%s: too many symlinks", p)
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func archFlag() int32 {
	if runtime.GOARCH == "arm64" {
		return ldcache.FlagAArch64
	}
	return ldcache.FlagX8664
}
