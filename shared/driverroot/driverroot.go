// Package driverroot looks up files inside a driver root: a directory that
// is another system's root file system (the host's / mounted into a
// container, a GPU Operator driver container's /run/nvidia/driver, a
// test root). Paths are resolved the way that system would resolve them:
// symlinks are followed inside the root, absolute targets included, and
// ".." never climbs above it. Real NVML loading and the CDI generator both
// use it, so they agree on which file a name means.
package driverroot

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// MaxLinks bounds the symlinks followed for one path, as the kernel's
// MAXSYMLINKS does.
const MaxLinks = 40

// ErrTooManyLinks is returned for a symlink loop or an over-long chain.
var ErrTooManyLinks = errors.New("too many levels of symbolic links")

// LibDirs are the library directories, inside a driver root, that hold an
// NVIDIA driver's libraries on the distributions nvinject knows.
var LibDirs = []string{
	"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
	"/lib64", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
	// Where CUDA images and GKE-style nodes keep the driver.
	"/usr/local/nvidia/lib64",
}

// Resolve returns the path p (absolute, as seen from inside root) names
// once every symlink along it has been followed inside root: an absolute
// link target starts again at root, a relative one at the link's
// directory. The result is absolute and relative to root, and exists.
func Resolve(root, p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("resolve %q in driver root %s: the path must be absolute", p, root)
	}
	cur := "/"
	rest := p
	links := 0
	for rest != "" {
		var comp string
		comp, rest, _ = strings.Cut(strings.TrimLeft(rest, "/"), "/")
		switch comp {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, comp)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", fmt.Errorf("resolve %s in driver root %s: %w", p, root, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if links++; links > MaxLinks {
			return "", fmt.Errorf("resolve %s in driver root %s: %w", p, root, ErrTooManyLinks)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", fmt.Errorf("resolve %s in driver root %s: %w", p, root, err)
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		rest = target + "/" + rest
	}
	return cur, nil
}

// Stat resolves p inside root and stats what it names. It returns the
// resolved path (relative to root) and the file's info.
func Stat(root, p string) (string, fs.FileInfo, error) {
	r, err := Resolve(root, p)
	if err != nil {
		return "", nil, err
	}
	fi, err := os.Lstat(filepath.Join(root, r))
	if err != nil {
		return "", nil, err
	}
	return r, fi, nil
}

// FindLibrary returns the host path of the file the library name (a soname
// such as libnvidia-ml.so.1) means in root's LibDirs, or "" when root has
// none.
func FindLibrary(root, name string) string {
	for _, d := range LibDirs {
		r, fi, err := Stat(root, path.Join(d, name))
		if err == nil && fi.Mode().IsRegular() {
			return filepath.Join(root, r)
		}
	}
	return ""
}

// Version is a driver version found in a driver root, and the file it was
// read from (inside the root).
type Version struct {
	Version string
	File    string
}

var versionRE = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?$`)

// ValidVersion reports whether v is shaped like an NVIDIA driver version
// (535.261.03, 580.95.05, 550.54).
func ValidVersion(v string) bool { return versionRE.MatchString(v) }

// DriverVersion reads the version of the NVIDIA driver installed in root
// from its libraries' file names: what libnvidia-ml.so.1 (else
// libcuda.so.1) resolves to inside root, else the one libnvidia-ml.so.<ver>
// file in LibDirs. ok is false when root holds no NVIDIA driver.
func DriverVersion(root string) (v Version, ok bool, err error) {
	return DriverVersionIn(root, nil)
}

// DriverVersionIn is DriverVersion looking in dirs (the root's own library
// directories: its ld.so.conf's, its ld.so.cache's) before LibDirs.
func DriverVersionIn(root string, dirs []string) (v Version, ok bool, err error) {
	dirs = append(slices.Clip(dirs), LibDirs...)
	for _, lib := range []string{"libnvidia-ml.so", "libcuda.so"} {
		for _, d := range dirs {
			r, fi, err := Stat(root, path.Join(d, lib+".1"))
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			if ver, found := strings.CutPrefix(path.Base(r), lib+"."); found && ValidVersion(ver) {
				return Version{Version: ver, File: r}, true, nil
			}
		}
	}
	var found []Version
	seen := map[string]bool{}
	for _, d := range dirs {
		real, err := Resolve(root, d)
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		matches, err := filepath.Glob(filepath.Join(root, real, "libnvidia-ml.so.*.*"))
		if err != nil {
			return Version{}, false, err
		}
		for _, m := range matches {
			ver := strings.TrimPrefix(filepath.Base(m), "libnvidia-ml.so.")
			if ValidVersion(ver) {
				found = append(found, Version{Version: ver, File: path.Join(d, filepath.Base(m))})
			}
		}
	}
	switch len(found) {
	case 0:
		return Version{}, false, nil
	case 1:
		return found[0], true, nil
	}
	names := make([]string, len(found))
	for i, f := range found {
		names[i] = f.File
	}
	return Version{}, false, fmt.Errorf("driver root %s holds libraries of more than one NVIDIA driver (%s) and no libnvidia-ml.so.1 naming the current one; remove the stale ones or recreate the soname links with `ldconfig -r %s`", root, strings.Join(names, ", "), root)
}

// IsSystemRoot reports whether root is a whole system's root file system
// (it has usr/bin or usr/lib: the host's /, a GPU Operator driver
// container's /run/nvidia/driver) rather than a directory holding only the
// driver (/usr/local/nvidia, GKE's /home/kubernetes/bin/nvidia).
func IsSystemRoot(root string) bool {
	for _, d := range []string{"/usr/bin", "/usr/lib"} {
		if _, fi, err := Stat(root, d); err == nil && fi.IsDir() {
			return true
		}
	}
	return false
}

// DevRoot is the directory whose dev/ holds the GPUs' device nodes: given
// when set, else root when root is a system root, else the host's "/".
func DevRoot(root, given string) string {
	switch {
	case given != "":
		return given
	case root == "" || IsSystemRoot(root):
		return root
	}
	return "/"
}

// FS returns root as an fs.FS whose names are resolved inside root
// (Resolve): an absolute link in the root's /etc/ld.so.conf.d leads into
// the root, never to the host's file of that name.
func FS(root string) fs.FS { return rootFS(root) }

type rootFS string

func (r rootFS) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrInvalid}
	}
	p, err := Resolve(string(r), "/"+name)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return os.Open(filepath.Join(string(r), p))
}
