// Package hook implements nvinject-cdi-hook's OCI createContainer hooks:
// create-symlinks, enable-cuda-compat and update-ldcache, with the
// arguments NVIDIA's nvidia-cdi-hook takes. A hook runs as the runtime's
// user (root) on a container root file system whose author is not trusted
// (docs/security.md): every path inside it is opened with
// openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS), so a symlink in the image,
// absolute or climbing with "..", resolves inside the container root and
// never on the host, and /proc's magic links (/proc/1/root) are refused;
// writes also refuse to cross a mount point (RESOLVE_NO_XDEV); only
// regular files and directories are opened for reading; no program runs.
package hook

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nvinject/nvinject/shared/contract"
)

// Resolution rules: reads stay in the root and refuse magic links; writes
// also stay on the root's own mounts, so a volume (or a host path) mounted
// into the container is never written through.
const (
	resolveRead  = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS
	resolveWrite = resolveRead | unix.RESOLVE_NO_XDEV
)

// Root is an open container root file system. It is an fs.FS whose paths
// resolve inside it.
type Root struct {
	dir  *os.File
	path string
}

// OpenRoot opens the directory p as a container root. A root that is, or
// leads through links to, the host's / is refused.
func OpenRoot(p string) (*Root, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open container root %s: %w", contract.Quote(p), err)
	}
	r := &Root{dir: os.NewFile(uintptr(fd), p), path: p}
	var st, host unix.Stat_t
	if err := errors.Join(unix.Fstat(fd, &st), unix.Stat("/", &host)); err != nil {
		r.Close()
		return nil, fmt.Errorf("stat container root %s: %w", contract.Quote(p), err)
	}
	if st.Dev == host.Dev && st.Ino == host.Ino {
		r.Close()
		return nil, fmt.Errorf("the container root %s is the host's / (through a link?); refusing to change it", contract.Quote(p))
	}
	return r, nil
}

// Close releases the root.
func (r *Root) Close() error { return r.dir.Close() }

// Path is the root's host path.
func (r *Root) Path() string { return r.path }

// RealPath is where the root's directory is on the host after every link
// was followed.
func (r *Root) RealPath() (string, error) {
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(int(r.dir.Fd())))
}

// where names p inside the root for an error, bounded.
func (r *Root) where(p string) string {
	return contract.Quote(p) + " in container root " + contract.Quote(r.path)
}

// open opens p (a path inside the root) with flags, resolving it inside
// the root with resolve.
func (r *Root) open(p string, flags, resolve uint64) (*os.File, error) {
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: resolve}
	for {
		fd, err := unix.Openat2(int(r.dir.Fd()), p, &how)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.ENOSYS) {
			return nil, fmt.Errorf("open %s: openat2 is not available (Linux 5.6 or later is needed to work in a container root safely): %w", r.where(p), err)
		}
		if err != nil {
			return nil, &os.PathError{Op: "open in container root", Path: contract.Quote(p), Err: err}
		}
		return os.NewFile(uintptr(fd), path.Join(r.path, p)), nil
	}
}

// stat resolves p inside the root (following links) without opening it.
func (r *Root) stat(p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	f, err := r.open(p, unix.O_PATH, resolveRead)
	if err != nil {
		return st, err
	}
	defer f.Close()
	return st, unix.Fstat(int(f.Fd()), &st)
}

// openRegular opens p for reading when it is a regular file. It is looked
// up with O_PATH first and reopened through that handle, so a device node
// or FIFO an image put there is never opened (opening one runs its
// driver), and nothing can swap the file in between.
func (r *Root) openRegular(p string) (*os.File, error) {
	f, err := r.open(p, unix.O_PATH, resolveRead)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, &os.PathError{Op: "stat in container root", Path: contract.Quote(p), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, &os.PathError{Op: "open in container root", Path: contract.Quote(p), Err: errNotRegular}
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "reopen in container root (through /proc/self/fd)", Path: contract.Quote(p), Err: err}
	}
	return os.NewFile(uintptr(fd), path.Join(r.path, p)), nil
}

var (
	errNotRegular = errors.New("not a regular file")
	errTooMany    = errors.New("more entries than a hook reads")
)

// Open implements fs.FS: name (fs.ValidPath, relative to the root) opens
// when it is a directory or a regular file.
func (r *Root) Open(name string) (fs.File, error) {
	if !fs.ValidPath(name) {
		return nil, &fs.PathError{Op: "open", Path: contract.Quote(name), Err: fs.ErrInvalid}
	}
	f, err := r.open(name, unix.O_RDONLY|unix.O_DIRECTORY, resolveRead)
	if errors.Is(err, unix.ENOTDIR) {
		return r.openRegular(name)
	}
	return f, err
}

// Exists reports whether p exists inside the root.
func (r *Root) Exists(p string) bool {
	_, err := r.stat(p)
	return err == nil
}

// ReadFile reads the regular file p inside the root, at most limit bytes.
func (r *Root) ReadFile(p string, limit int64) ([]byte, error) {
	f, err := r.openRegular(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAtMost(f, r.where(p), limit)
}

// ReadDir lists the directory p inside the root, refusing more than max
// entries.
func (r *Root) ReadDir(p string, max int) ([]os.DirEntry, error) {
	f, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY, resolveRead)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []os.DirEntry
	for {
		ents, err := f.ReadDir(1024)
		out = append(out, ents...)
		if len(out) > max {
			return nil, fmt.Errorf("directory %s: %w (%d)", r.where(p), errTooMany, max)
		}
		if err != nil || len(ents) == 0 {
			return out, nil
		}
	}
}

// MkdirAll opens the directory p inside the root for writing in it,
// creating it and its parents (mode 0755) where missing.
func (r *Root) MkdirAll(p string) (*os.File, error) {
	p = path.Clean("/" + p)
	d, err := r.open(p, unix.O_PATH|unix.O_DIRECTORY, resolveWrite)
	if errors.Is(err, unix.EXDEV) {
		return nil, fmt.Errorf("%s is on another mount than the container's root file system (a volume?); refusing to write there: %w", r.where(p), err)
	}
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
		return nil, fmt.Errorf("create %s: %w", r.where(p), err)
	}
	return r.open(p, unix.O_PATH|unix.O_DIRECTORY, resolveWrite)
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
		return fmt.Errorf("create link %s -> %s: %w", r.where(link), contract.Quote(target), err)
	}
	if err := unix.Renameat(fd, tmp, fd, base); err != nil {
		_ = unix.Unlinkat(fd, tmp, 0)
		return fmt.Errorf("create link %s -> %s: %w (a directory or mount point is in the way)", r.where(link), contract.Quote(target), err)
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
		return fmt.Errorf("write %s: %w", r.where(p), err)
	}
	f := os.NewFile(uintptr(wfd), filepath.Join(r.path, p))
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Chmod(0o644), f.Close()); err != nil {
		_ = unix.Unlinkat(fd, tmp, 0)
		return fmt.Errorf("write %s: %w", r.where(p), err)
	}
	if err := unix.Renameat(fd, tmp, fd, base); err != nil {
		_ = unix.Unlinkat(fd, tmp, 0)
		return fmt.Errorf("write %s: %w", r.where(p), err)
	}
	return nil
}

// Remove removes the file or link p inside the root, never following it;
// a p that is missing, or is a directory, is left alone.
func (r *Root) Remove(p string) error {
	p = path.Clean("/" + p)
	dir, err := r.open(path.Dir(p), unix.O_PATH|unix.O_DIRECTORY, resolveWrite)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove %s: %w", r.where(p), err)
	}
	defer dir.Close()
	if err := unix.Unlinkat(int(dir.Fd()), path.Base(p), 0); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EISDIR) {
		return fmt.Errorf("remove %s: %w", r.where(p), err)
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
