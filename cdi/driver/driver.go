// Package driver finds an NVIDIA driver's user-space files under a driver
// root, the way NVIDIA's own generator (nvidia-ctk cdi generate) does: every
// library named *.so.<driver version> in the directories the root's
// ld.so.cache leads to, the driver's binaries in /usr/bin and /usr/sbin, its
// GSP firmware files and the IPC sockets and pipes its daemons keep. Every
// path is resolved inside the root (shared/driverroot), absolute links
// included.
package driver

import (
	"debug/elf"
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
	"github.com/nvinject/nvinject/shared/driverroot"
)

// Binaries are the driver's command-line tools, and BinDirs where they are
// looked for.
var (
	Binaries = []string{
		"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
		"nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
	}
	BinDirs = []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"}
)

// IPC paths of the driver's daemons, put into containers when they exist.
const (
	PersistencedSocket  = "/run/nvidia-persistenced/socket"
	FabricManagerSocket = "/run/nvidia-fabricmanager/socket"
	MPSPipeDir          = "/tmp/nvidia-mps"
)

// FirmwareDirs hold nvidia/<version>/ firmware directories.
var FirmwareDirs = []string{"/lib/firmware", "/usr/lib/firmware"}

// SimulatedFacts is the facts file of a SIMULATED driver root (see the
// simroot package); real driver roots do not have it.
const SimulatedFacts = "/usr/share/nvinject/simulated-gpus.json"

// Library is one driver library. All paths are inside the driver root.
type Library struct {
	// File is the versioned library (…/libcuda.so.535.261.03) with every
	// symlink resolved.
	File string
	// Soname is the name the loader asks for (libcuda.so.1), from the
	// file's ELF DT_SONAME, else from the root's ld.so.cache; "" when that
	// is the file's own name or unknown.
	Soname string
	// DevLink is the unversioned link name (libcuda.so) in File's
	// directory: set when the root has that link, and always for libcuda
	// (programs dlopen "libcuda.so"; Triton links -lcuda).
	DevLink string
	// Links are the root's other paths for this library, such as Debian's
	// /usr/lib/x86_64-linux-gnu/libcuda.so.1 reaching
	// …/nvidia/current/libcuda.so.535.261.03 through /etc/alternatives.
	Links []string
}

// Dir is the directory holding the library file.
func (l Library) Dir() string { return path.Dir(l.File) }

// File is a driver file: Path is where a container sees it (the root's
// public name), Source the file Path resolves to inside the driver root.
type File struct {
	Path   string
	Source string
}

// Files are the driver files to put into a container.
type Files struct {
	Version   string
	Libraries []Library
	Binaries  []File
	Firmware  []File
	// IPC are the sockets and the MPS pipe directory of running daemons.
	IPC            []File
	SimulatedFacts string
}

// LibDirs are the directories of the libraries and their links, the
// folders a container's ld.so.cache must index.
func (f Files) LibDirs() []string {
	var dirs []string
	for _, l := range f.Libraries {
		dirs = append(dirs, l.Dir())
		for _, p := range l.Links {
			dirs = append(dirs, path.Dir(p))
		}
	}
	slices.Sort(dirs)
	return slices.Compact(dirs)
}

// ErrNoDriverRoot is returned when the driver root does not exist.
var ErrNoDriverRoot = errors.New("driver root not found")

// ErrVersionMismatch is returned when the driver root holds another driver
// than the one NVML reports.
var ErrVersionMismatch = errors.New("driver version mismatch")

// Find returns the files of driver version under root. source says where
// version came from ("NVML", or the simulation's option or default), for
// the message when root holds another driver.
func Find(root, version, source string) (Files, error) {
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		return Files{}, fmt.Errorf("%w: %s is not a directory; point --driver-root at the directory holding the driver install (/ on a host install, /run/nvidia/driver for the GPU Operator's driver container)", ErrNoDriverRoot, root)
	}
	if version == "" {
		return Files{}, errors.New("driver version is empty; NVML did not report one")
	}
	if source == "" {
		source = "NVML"
	}
	if err := checkVersion(root, version, source); err != nil {
		return Files{}, err
	}
	libs, err := findLibraries(root, version)
	if err != nil {
		return Files{}, err
	}
	f := Files{Version: version, Libraries: libs}
	for _, b := range Binaries {
		for _, dir := range BinDirs {
			p := path.Join(dir, b)
			if r, fi, err := driverroot.Stat(root, p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				f.Binaries = append(f.Binaries, File{Path: p, Source: r})
				break
			}
		}
	}
	if f.Firmware, err = findFirmware(root, version); err != nil {
		return Files{}, err
	}
	for _, ipc := range []struct {
		path string
		mode fs.FileMode
	}{{PersistencedSocket, fs.ModeSocket}, {FabricManagerSocket, fs.ModeSocket}, {MPSPipeDir, fs.ModeDir}} {
		for _, p := range []string{ipc.path, strings.Replace(ipc.path, "/run/", "/var/run/", 1)} {
			if r, fi, err := driverroot.Stat(root, p); err == nil && fi.Mode().Type() == ipc.mode {
				f.IPC = append(f.IPC, File{Path: p, Source: r})
				break
			}
		}
	}
	if r, fi, err := driverroot.Stat(root, SimulatedFacts); err == nil && fi.Mode().IsRegular() {
		f.SimulatedFacts = r
	}
	return f, nil
}

// checkVersion refuses a root that holds another driver than version.
func checkVersion(root, version, source string) error {
	have, ok, err := driverroot.DriverVersion(root)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("driver root %s holds no NVIDIA driver (no libnvidia-ml.so.1 or libnvidia-ml.so.%s in %s); NVML reports %s (%s): point --driver-root at the directory holding that driver's files", root, version, strings.Join(driverroot.LibDirs, ", "), version, source)
	}
	if have.Version == version {
		return nil
	}
	fix := fmt.Sprintf("point --driver-root at the root of the driver the kernel runs (%s), or reinstall the driver so its user space and kernel module match", version)
	if strings.Contains(source, "SIMULATED") {
		fix = fmt.Sprintf("pass --nvml=sim:<model>,driver=%s to simulate the root's driver (or leave driver= out: the simulation follows the root), or point --driver-root at a root holding %s", have.Version, version)
	}
	return fmt.Errorf("%w: NVML reports %s (%s) but the driver root %s holds %s (%s); %s", ErrVersionMismatch, version, source, root, have.Version, have.File, fix)
}

// candidate collects what is known about one library file.
type candidate struct {
	lib       Library
	cacheName []string
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
	suffix := ".so." + version
	byFile := map[string]*candidate{}
	add := func(file string) *candidate {
		c, ok := byFile[file]
		if !ok {
			c = &candidate{lib: Library{File: file}}
			byFile[file] = c
		}
		return c
	}
	var dirs []string
	arch := archFlag()
	for _, e := range entries {
		if e.Arch() != arch {
			continue
		}
		file, err := driverroot.Resolve(root, e.Path)
		if err != nil || !strings.HasSuffix(path.Base(file), suffix) {
			continue
		}
		c := add(file)
		c.cacheName = append(c.cacheName, e.Name)
		if e.Path != file {
			c.lib.Links = append(c.lib.Links, e.Path)
		}
		dirs = append(dirs, path.Dir(file), path.Dir(e.Path))
	}
	if len(byFile) == 0 {
		return nil, fmt.Errorf("%s lists no library of driver %s (no *%s file behind its entries); rebuild it with `ldconfig -r %s` after installing the driver", cachePath, version, suffix, root)
	}
	// Every *.so.<version> in those directories belongs to the driver,
	// whether or not ldconfig indexed it (libnvidia-cfg under Debian's
	// nvidia/, libnvidia-nvvm.so.<version> without a soname link).
	slices.Sort(dirs)
	for _, d := range slices.Compact(dirs) {
		for _, dir := range []string{d, path.Join(d, "vdpau")} {
			real, err := driverroot.Resolve(root, dir)
			if err != nil {
				continue
			}
			ents, err := os.ReadDir(filepath.Join(root, real))
			if err != nil {
				continue
			}
			for _, ent := range ents {
				if !strings.HasSuffix(ent.Name(), suffix) {
					continue
				}
				p := path.Join(dir, ent.Name())
				file, fi, err := driverroot.Stat(root, p)
				if err != nil || !fi.Mode().IsRegular() || !strings.HasSuffix(path.Base(file), suffix) {
					continue
				}
				c := add(file)
				if p != file {
					c.lib.Links = append(c.lib.Links, p)
				}
			}
		}
	}
	out := make([]Library, 0, len(byFile))
	for _, c := range byFile {
		out = append(out, c.finish(root))
	}
	slices.SortFunc(out, func(a, b Library) int { return strings.Compare(a.File, b.File) })
	if !slices.ContainsFunc(out, func(l Library) bool { return strings.HasPrefix(path.Base(l.File), "libnvidia-ml.so.") }) {
		return nil, fmt.Errorf("driver root %s has no libnvidia-ml.so.%s among the libraries %s leads to; rerun `ldconfig -r %s`", root, version, cachePath, root)
	}
	return out, nil
}

// finish settles the soname and links of a library file.
func (c *candidate) finish(root string) Library {
	l := c.lib
	base := path.Base(l.File)
	stem, _, _ := strings.Cut(base, ".so")
	dev := stem + ".so"
	l.Soname = elfSoname(filepath.Join(root, l.File))
	if l.Soname == "" {
		for _, n := range c.cacheName {
			if n != base && n != dev {
				l.Soname = n
				break
			}
		}
	}
	if l.Soname == base {
		l.Soname = ""
	}
	if _, err := os.Lstat(filepath.Join(root, l.Dir(), dev)); err == nil || slices.Contains(c.cacheName, dev) || stem == "libcuda" {
		l.DevLink = dev
	}
	own := []string{l.File, path.Join(l.Dir(), l.Soname), path.Join(l.Dir(), l.DevLink)}
	l.Links = slices.DeleteFunc(l.Links, func(p string) bool { return slices.Contains(own, p) })
	slices.Sort(l.Links)
	l.Links = slices.Compact(l.Links)
	return l
}

// elfSoname reads a library's DT_SONAME; "" when it is not an ELF file
// (the simulated root's placeholders) or names none.
func elfSoname(p string) string {
	f, err := elf.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) == 0 {
		return ""
	}
	return names[0]
}

func findFirmware(root, version string) ([]File, error) {
	for _, base := range FirmwareDirs {
		dir := path.Join(base, "nvidia", version)
		real, fi, err := driverroot.Stat(root, dir)
		if err != nil || !fi.IsDir() {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(root, real))
		if err != nil {
			return nil, fmt.Errorf("read the firmware directory %s in driver root %s: %w", dir, root, err)
		}
		var out []File
		for _, ent := range ents {
			gsp, _ := path.Match("gsp*.bin", ent.Name())
			ucode, _ := path.Match("ucodes*.bin", ent.Name())
			if !gsp && !ucode {
				continue
			}
			p := path.Join(dir, ent.Name())
			if r, fi, err := driverroot.Stat(root, p); err == nil && fi.Mode().IsRegular() {
				out = append(out, File{Path: p, Source: r})
			}
		}
		if len(out) > 0 {
			return out, nil
		}
	}
	return nil, nil
}

func archFlag() int32 {
	if runtime.GOARCH == "arm64" {
		return ldcache.FlagAArch64
	}
	return ldcache.FlagX8664
}
