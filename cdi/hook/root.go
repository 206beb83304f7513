// Package hook implements nvinject-cdi-hook's OCI createContainer hooks:
// create-symlinks, enable-cuda-compat and update-ldcache, with the
// arguments NVIDIA's nvidia-cdi-hook takes. A hook runs as the runtime's
// user (root) on a container root file system it must not trust: every path
// inside it is opened with openat2(RESOLVE_IN_ROOT), so a symlink in the
// image, absolute or not, resolves inside the container root and never on
// the host.
package hook

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Root is an open container root file system.
type Root struct {
	dir  *os.File
	path string
}

// OpenRoot opens the directory p as a container root.
func OpenRoot(p string) (*Root, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open container root %s: %w", p, err)
	}
	return &Root{dir: os.NewFile(uintptr(fd), p), path: p}, nil
}

// Close releases the root.
func (r *Root) Close() error { return r.dir.Close() }

// Path is the root's host path.
func (r *Root) Path() string { return r.path }

// open opens p (a path inside the root) with flags, resolving it inside
// the root.
func (r *Root) open(p string, flags uint64) (*os.File, error) {
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	for {
		fd, err := unix.Openat2(int(r.dir.Fd()), p, &how)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOSYS) {
			return nil, fmt.Errorf("open %s in container root %s: openat2 is not available (Linux 5.6 or later is needed to work in a container root safely): %w", p, r.path, err)
		}
		if err != nil {
			return nil, &os.PathError{Op: "open in container root", Path: p, Err: err}
		}
		return os.NewFile(uintptr(fd), path.Join(r.path, p)), nil
	}
}

// Exists reports whether p exists inside the root.
func (r *Root) Exists(p string) bool {
	f, err := r.open(p, unix.O_PATH)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// ReadFile reads p inside the root, at most limit bytes.
func (r *Root) ReadFile(p string, limit int64) ([]byte, error) {
	f, err := r.open(p, unix.O_RDONLY|unix.O_NOCTTY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAtMost(f, p+" in container root "+r.path, limit)
}

// ReadDir lists the directory p inside the root.
func (r *Root) ReadDir(p string) ([]os.DirEntry, error) {
	f, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ReadDir(-1)
}

// MkdirAll opens the directory p inside the root, creating it and its
// parents (mode 0755) where missing.
func (r *Root) MkdirAll(p string) (*os.File, error) {
	p = path.Clean("/" + p)
	d, err := r.open(p, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil || !errors.Is(err, unix.ENOENT) || p == "/" {
		return d, err
	}
	parent, err := r.MkdirAll(path.Dir(p))
	if err != nil {
		return nil, err
	}
	err = unix.Mkdirat(int(parent.Fd()), path.Base(p), 0o755)
	parent.Close()
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("create %s in container root %s: %w", p, r.path, err)
	}
	return r.open(p, unix.O_PATH|unix.O_DIRECTORY)
}

var tmpSeq atomic.Uint64

func tmpName(base string) string {
	return "." + base + ".nvinject-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(tmpSeq.Add(1), 10)
}

// Symlink makes link (inside the root) a symlink to target, replacing a
// file or link already there; a link already pointing at target is left
// alone. Only link's directory is resolved; link itself is replaced, never
// followed.
func (r *Root) Symlink(target, link string) error {
	dir, err := r.MkdirAll(path.Dir(link))
	if err != nil {
		return err
	}
	defer dir.Close()
	fd, base := int(dir.Fd()), path.Base(link)
	if cur, err := readlinkat(fd, base); err == nil && cur == target {
		return nil
	}
	tmp := tmpName(base)
	if err := unix.Symlinkat(target, fd, tmp); err != nil {
		return fmt.Errorf("create link %s -> %s in container root %s: %w", link, target, r.path, err)
	}
	if err := unix.Renameat(fd, tmp, fd, base); err != nil {
		_ = unix.Unlinkat(fd, tmp, 0)
		return fmt.Errorf("create link %s -> %s in container root %s: %w (a directory or mount point is in the way)", link, target, r.path, err)
	}
	return nil
}

// WriteFile writes data to p inside the root (mode 0644, world-readable so
// non-root containers read it), replacing the file atomically; p itself is
// never followed.
func (r *Root) WriteFile(p string, data []byte) error {
	dir, err := r.MkdirAll(path.Dir(p))
	if err != nil {
		return err
	}
	defer dir.Close()
	fd, base := int(dir.Fd()), path.Base(p)
	tmp := tmpName(base)
	wfd, err := unix.Openat(fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("write %s in container root %s: %w", p, r.path, err)
	}
	f := os.NewFile(uintptr(wfd), filepath.Join(r.path, p))
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Chmod(0o644), f.Close()); err != nil {
		_ = unix.Unlinkat(fd, tmp, 0)
		return fmt.Errorf("write %s in container root %s: %w", p, r.path, err)
	}
	if err := unix.Renameat(fd, tmp, fd, base); err != nil {
		_ = unix.Unlinkat(fd, tmp, 0)
		return fmt.Errorf("write %s in container root %s: %w", p, r.path, err)
	}
	return nil
}

func readlinkat(dirfd int, name string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
