// Package driver finds an NVIDIA driver's user-space files under a driver
// root wherever that driver keeps them: every library named
// *.so.<driver version> in the directories the root's ld.so.cache and
// ld.so.conf lead to and the distributions' library directories; the
// driver's binaries as the ELF files they are (a wrapper script followed to
// what it runs, or found in the bin/ beside the libraries); its GSP
// firmware, under /lib/firmware or beside the libraries; the IPC sockets
// and pipes its daemons keep. Every path is resolved inside the root
// (shared/driverroot), absolute links included. A root that is only the
// driver's directory (GKE's /home/kubernetes/bin/nvidia) is placed under
// DriverDirPrefix in the container.
package driver

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
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

// DriverDirPrefix is where a driver directory's libraries go in the
// container: CUDA images' LD_LIBRARY_PATH names /usr/local/nvidia/lib64,
// and the update-ldcache hook indexes it for any other image.
const DriverDirPrefix = "/usr/local/nvidia"

// maxWrapper bounds the wrapper script WrapperTarget reads.
const maxWrapper = 4096

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
	Version string
	// Prefix is the container directory the libraries' root paths are
	// placed under: "" for a system root, DriverDirPrefix for a driver
	// directory.
	Prefix    string
	Libraries []Library
	Binaries  []File
	Firmware  []File
	// IPC are the sockets and the MPS pipe directory of running daemons.
	IPC            []File
	SimulatedFacts string
}

// InContainer is where the root's library path p goes in the container.
func (f Files) InContainer(p string) string {
	if f.Prefix == "" {
		return p
	}
	return path.Join(f.Prefix, p)
}

// LibDirs are the container directories of the libraries and their links,
// the folders a container's ld.so.cache must index.
func (f Files) LibDirs() []string {
	var dirs []string
	for _, l := range f.Libraries {
		dirs = append(dirs, f.InContainer(l.Dir()))
		for _, p := range l.Links {
			dirs = append(dirs, f.InContainer(path.Dir(p)))
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
	entries, conf, err := loaderConfig(root)
	if err != nil {
		return Files{}, err
	}
	if err := checkVersion(root, version, source, versionDirs(entries, conf)); err != nil {
		return Files{}, err
	}
	libs, err := findLibraries(root, version, entries, conf)
	if err != nil {
		return Files{}, err
	}
	f := Files{Version: version, Libraries: libs}
	system := driverroot.IsSystemRoot(root)
	if !system {
		f.Prefix = DriverDirPrefix
	}
	beside := besideDirs(libs)
	f.Binaries = findBinaries(root, beside, system)
	if f.Firmware, err = findFirmware(root, version, beside); err != nil {
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

// Installed reads the version of the driver installed in root, looking
// where Find looks for its libraries: the root's ld.so.cache and
// ld.so.conf directories as well as the distributions'.
func Installed(root string) (driverroot.Version, bool, error) {
	entries, conf, err := loaderConfig(root)
	if err != nil {
		return driverroot.Version{}, false, err
	}
	return driverroot.DriverVersionIn(root, versionDirs(entries, conf))
}

// versionDirs are the root's own directories of NVML and libcuda.
func versionDirs(entries []ldcache.Entry, conf []string) []string {
	dirs := slices.Clone(conf)
	for _, e := range entries {
		if e.Name == "libnvidia-ml.so.1" || e.Name == "libcuda.so.1" {
			dirs = append(dirs, path.Dir(e.Path))
		}
	}
	return dirs
}

// checkVersion refuses a root that holds another driver than version.
func checkVersion(root, version, source string, dirs []string) error {
	have, ok, err := driverroot.DriverVersionIn(root, dirs)
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

// loaderConfig reads the root's ld.so.cache (none in a driver directory)
// and the directories its ld.so.conf lists.
func loaderConfig(root string) ([]ldcache.Entry, []string, error) {
	cachePath := filepath.Join(root, "etc/ld.so.cache")
	var entries []ldcache.Entry
	switch data, err := os.ReadFile(cachePath); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, nil, fmt.Errorf("read %s: %w; make it readable or run `ldconfig -r %s`", cachePath, err, root)
	default:
		if entries, err = ldcache.Parse(data); err != nil {
			return nil, nil, fmt.Errorf("parse %s: %w; regenerate it with `ldconfig -r %s`", cachePath, err, root)
		}
	}
	conf, err := ldcache.ConfDirs(driverroot.FS(root))
	if err != nil {
		return nil, nil, fmt.Errorf("read the loader configuration of driver root %s: %w; trim its /etc/ld.so.conf and ld.so.conf.d", root, err)
	}
	return entries, conf, nil
}

func findLibraries(root, version string, entries []ldcache.Entry, conf []string) ([]Library, error) {
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
		if !alias(root, e.Path, file) {
			c.lib.Links = append(c.lib.Links, e.Path)
		}
		dirs = append(dirs, path.Dir(file), path.Dir(e.Path))
	}
	dirs = append(dirs, conf...)
	dirs = append(dirs, driverroot.LibDirs...)
	// Every *.so.<version> in those directories belongs to the driver,
	// whether or not ldconfig indexed it (libnvidia-cfg under Debian's
	// nvidia/, libnvidia-nvvm.so.<version> without a soname link, a driver
	// directory without a cache at all).
	seen := map[string]bool{}
	for _, d := range dirs {
		for _, dir := range []string{d, path.Join(d, "vdpau")} {
			if seen[dir] || is32Bit(dir) {
				continue
			}
			seen[dir] = true
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
				if _, known := byFile[file]; !known && !nativeArch(filepath.Join(root, file), arch) {
					continue
				}
				c := add(file)
				if !alias(root, p, file) {
					c.lib.Links = append(c.lib.Links, p)
				}
			}
		}
	}
	if len(byFile) == 0 {
		return nil, fmt.Errorf("driver root %s has no library of driver %s (no *%s file) in the directories its ld.so.cache and ld.so.conf name or in %s; install the driver there, or run `ldconfig -r %s` after installing it elsewhere", root, version, suffix, strings.Join(driverroot.LibDirs, ", "), root)
	}
	out := make([]Library, 0, len(byFile))
	for _, c := range byFile {
		out = append(out, c.finish(root))
	}
	slices.SortFunc(out, func(a, b Library) int { return strings.Compare(a.File, b.File) })
	if !slices.ContainsFunc(out, func(l Library) bool { return strings.HasPrefix(path.Base(l.File), "libnvidia-ml.so.") }) {
		return nil, fmt.Errorf("driver root %s has no libnvidia-ml.so.%s among the libraries of driver %s; reinstall the driver, or rerun `ldconfig -r %s`", root, version, version, root)
	}
	return out, nil
}

// alias reports whether p names file itself or a name in file's own
// directory reached through a linked directory (a merged-/usr root's
// /lib/x86_64-linux-gnu): the links made in file's directory cover it, and
// in an image with the same directory link it is the mounted file itself.
func alias(root, p, file string) bool {
	if p == file {
		return true
	}
	dir, err := driverroot.Resolve(root, path.Dir(p))
	return err == nil && dir == path.Dir(file)
}

// is32Bit reports whether dir is a 32-bit library directory, whose
// libraries a 64-bit container cannot load.
func is32Bit(dir string) bool {
	for _, e := range strings.Split(dir, "/") {
		switch e {
		case "lib32", "libx32", "i386-linux-gnu", "i686-linux-gnu", "arm-linux-gnueabihf":
			return true
		}
	}
	return false
}

// nativeArch reports whether the library at p is built for this machine's
// ABI; a file that is not ELF at all (a SIMULATED root's placeholder)
// passes.
func nativeArch(p string, arch int32) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != elf.ELFMAG {
		return true
	}
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	info, err := ldcache.ReadELF(f, fi.Size())
	return err == nil && ldcache.Entry{Flags: info.Flags}.Arch() == arch
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

// besideDirs are the directories beside the libraries' own (…/lib64 and
// …/lib give …), where a driver directory keeps bin/ and firmware/.
func besideDirs(libs []Library) []string {
	var out []string
	for _, l := range libs {
		if b := path.Base(l.Dir()); b == "lib64" || b == "lib" {
			out = append(out, path.Dir(l.Dir()))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// findBinaries finds each of Binaries as the ELF program it is: in BinDirs
// (a wrapper script there followed to the program it execs inside the
// root), else in the bin/ beside the libraries. A binary found outside
// BinDirs, or in a driver directory, goes to /usr/bin in the container,
// on every image's PATH.
func findBinaries(root string, beside []string, system bool) []File {
	var out []File
	for _, b := range Binaries {
		var dirs []string
		if system {
			dirs = append(dirs, BinDirs...)
		}
		for _, d := range beside {
			dirs = append(dirs, path.Join(d, "bin"), path.Join(d, "sbin"))
		}
		for _, dir := range dirs {
			p := path.Join(dir, b)
			src, ok := program(root, p)
			if !ok {
				continue
			}
			if !system || !slices.Contains(BinDirs, dir) {
				p = path.Join("/usr/bin", b)
			}
			out = append(out, File{Path: p, Source: src})
			break
		}
	}
	return out
}

// program resolves the executable p inside root to the program it runs:
// the ELF program a wrapper script execs, when that is in the root; else
// nothing for a wrapper (its target would be missing in the container);
// else p itself (an ELF program, or a script that is the tool itself).
func program(root, p string) (string, bool) {
	r, fi, err := driverroot.Stat(root, p)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", false
	}
	head := make([]byte, maxWrapper)
	f, err := os.Open(filepath.Join(root, r))
	if err != nil {
		return "", false
	}
	n, _ := io.ReadFull(f, head)
	f.Close()
	head = head[:n]
	if !strings.HasPrefix(string(head), "#!") {
		return r, true
	}
	target, ok := WrapperTarget(head)
	if !ok {
		// A script that runs no other program is the tool itself.
		return r, true
	}
	t, fi, err := driverroot.Stat(root, target)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return "", false
	}
	if m, err := readMagic(filepath.Join(root, t)); err != nil || m != elf.ELFMAG {
		return "", false
	}
	return t, true
}

func readMagic(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return "", err
	}
	return string(magic[:]), nil
}

// WrapperTarget returns the program a wrapper script (such as a host's
// /usr/bin/nvidia-smi: "#!/bin/sh" and "exec /usr/local/nvidia/bin/nvidia-smi
// "$@"") runs: the absolute path after the first exec command of its first
// maxWrapper bytes. Nothing is run; a target with shell expansion in it
// ($, `, globs, ~) is not followed, nor is any script without such a line.
func WrapperTarget(script []byte) (string, bool) {
	if len(script) > maxWrapper {
		script = script[:maxWrapper]
	}
	text := string(script)
	if !strings.HasPrefix(text, "#!") {
		return "", false
	}
	for _, line := range strings.Split(text, "\n")[1:] {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if fields[0] != "exec" {
			continue
		}
		args := fields[1:]
		for len(args) > 0 && strings.HasPrefix(args[0], "-") {
			if args[0] == "-a" && len(args) > 1 {
				// exec -a NAME: the name the program is run as.
				args = args[1:]
			}
			args = args[1:]
		}
		if len(args) == 0 {
			return "", false
		}
		arg := strings.Trim(args[0], `"'`)
		if !path.IsAbs(arg) || strings.ContainsAny(arg, "$`*?[]~{}\\;&|<>()") || path.Clean(arg) != arg {
			return "", false
		}
		return arg, true
	}
	return "", false
}

func findFirmware(root, version string, beside []string) ([]File, error) {
	bases := slices.Clone(FirmwareDirs)
	for _, d := range beside {
		bases = append(bases, path.Join(d, "firmware"))
	}
	for _, base := range bases {
		dir := path.Join(base, "nvidia", version)
		real, fi, err := driverroot.Stat(root, dir)
		if err != nil || !fi.IsDir() {
			continue
		}
		ents, err := os.ReadDir(filepath.Join(root, real))
		if err != nil {
			return nil, fmt.Errorf("read the firmware directory %s in driver root %s: %w", dir, root, err)
		}
		// Firmware kept beside the driver goes where the kernel's loader
		// and NVIDIA's tools look for it.
		ctr := dir
		if !slices.Contains(FirmwareDirs, base) {
			ctr = path.Join(FirmwareDirs[0], "nvidia", version)
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
				out = append(out, File{Path: path.Join(ctr, ent.Name()), Source: r})
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
