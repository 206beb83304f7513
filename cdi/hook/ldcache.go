package hook

import (
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nvinject/nvinject/cdi/ldcache"
	"github.com/nvinject/nvinject/shared/contract"
)

// DriverConf is the ld.so.conf.d drop-in listing the driver's folders, so
// an ldconfig the container runs later keeps them.
const DriverConf = "/etc/ld.so.conf.d/00-nvinject-driver.conf"

// CacheFile is the loader's cache in the container.
const CacheFile = "/etc/ld.so.cache"

// Generator is recorded in the caches update-ldcache writes (ldconfig -p
// prints it).
const Generator = "nvinject-cdi-hook"

// systemDirs are the directories glibc's loader and ldconfig trust
// without configuration: Debian's multiarch ones, RHEL's lib64 ones and
// /lib and /usr/lib; those the image lacks are skipped.
var systemDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// pseudoDirs are never indexed: no library lives there, and under /proc
// the kernel's magic links lead to the host.
var pseudoDirs = []string{"/proc", "/sys", "/dev"}

// Bounds on what update-ldcache indexes of an image.
const (
	maxDirEntries = 1 << 16
	maxDirs       = 2 * ldcache.MaxConfDirs
	maxEntries    = 1 << 17
)

// UpdateLDCache records folders in the image's ld.so.conf.d and writes
// its /etc/ld.so.cache in Go, the way glibc's ldconfig would, so no
// program runs and nothing the image wrote is ever an argument. Indexed,
// in this order (the first directory giving a soname wins, as in
// ldconfig): the CUDA compat directory enable-cuda-compat listed in
// CompatConf, folders, the directories of the image's /etc/ld.so.conf
// (ldcache.ConfDirs), and the system directories the image has; a
// directory reached twice (merged /usr) counts once; each directory's
// glibc-hwcaps subdirectories are indexed as ldconfig indexes them.
// Every path is resolved inside the root; /proc, /sys and /dev are never
// indexed. Soname links are not made: an entry names DIR/soname when that
// leads to the library, else the library's own file (the loader opens
// either); the image's packages bring their soname links and
// create-symlinks makes the driver's. It returns the cache's entries.
func UpdateLDCache(r *Root, folders []string) ([]ldcache.Entry, error) {
	folders = slices.Clone(folders)
	for i, f := range folders {
		if !path.IsAbs(f) || strings.ContainsAny(f, "\x00\n") {
			return nil, fmt.Errorf("--folder=%s is not an absolute path", contract.Quote(f))
		}
		folders[i] = path.Clean(f)
	}
	if len(folders) > 0 {
		if err := r.WriteFile(DriverConf, []byte(strings.Join(folders, "\n")+"\n")); err != nil {
			return nil, err
		}
		if !r.Exists(ldcache.ConfFile) {
			if err := r.WriteFile(ldcache.ConfFile, []byte("include /etc/ld.so.conf.d/*.conf\n")); err != nil {
				return nil, err
			}
		}
	}
	conf, err := ldcache.ConfDirs(r)
	if err != nil {
		return nil, fmt.Errorf("read the loader configuration of container root %s: %w", contract.Quote(r.path), err)
	}
	ix := indexer{r: r, seen: map[[2]uint64]bool{}}
	for _, group := range [][]string{compatDirs(r), folders, conf, systemDirs} {
		for _, d := range group {
			if err := ix.addDir(d); err != nil {
				return nil, err
			}
		}
	}
	var entries []ldcache.Entry
	for _, d := range ix.dirs {
		es, err := ix.index(d)
		if err != nil {
			return nil, err
		}
		if entries = append(entries, es...); len(entries) > maxEntries {
			return nil, fmt.Errorf("container root %s has more than %d libraries to index", contract.Quote(r.path), maxEntries)
		}
	}
	ldcache.Sort(entries)
	if err := r.WriteFile(CacheFile, ldcache.MarshalGenerated(entries, Generator)); err != nil {
		return nil, err
	}
	return entries, nil
}

// compatDirs reads the directories enable-cuda-compat listed, as plain
// absolute paths (never arguments); it rewrites or removes the file on
// every run, so an image's own copy does not reach here.
func compatDirs(r *Root) []string {
	data, err := r.ReadFile(CompatConf, 4096)
	if err != nil {
		return nil
	}
	var dirs []string
	for line := range strings.SplitSeq(string(data), "\n") {
		if line = strings.TrimSpace(line); path.IsAbs(line) {
			dirs = append(dirs, path.Clean(line))
		}
	}
	return dirs
}

type indexDir struct {
	path   string
	hwcaps string // glibc-hwcaps subdirectory name, "" for a listed directory
}

type indexer struct {
	r    *Root
	dirs []indexDir
	seen map[[2]uint64]bool
}

// addDir queues the directory d (an absolute, clean path inside the root)
// and its glibc-hwcaps subdirectories, unless it is missing, not a
// directory, a pseudo file system or already queued under another name.
func (ix *indexer) addDir(d string) error {
	for _, p := range pseudoDirs {
		if d == p || strings.HasPrefix(d, p+"/") {
			return nil
		}
	}
	if !ix.queue(indexDir{path: d}) {
		return nil
	}
	hw := path.Join(d, "glibc-hwcaps")
	ents, err := ix.r.ReadDir(hw, maxDirEntries)
	if errors.Is(err, errTooMany) {
		return err
	}
	for _, e := range ents {
		if n := e.Name(); !strings.HasPrefix(n, ".") && !strings.Contains(n, ":") && !e.Type().IsRegular() {
			ix.queue(indexDir{path: path.Join(hw, n), hwcaps: n})
		}
	}
	if len(ix.dirs) > maxDirs {
		return fmt.Errorf("container root %s lists more than %d library directories", contract.Quote(ix.r.path), maxDirs)
	}
	return nil
}

func (ix *indexer) queue(d indexDir) bool {
	st, err := ix.r.stat(d.path)
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false
	}
	key := [2]uint64{st.Dev, st.Ino}
	if ix.seen[key] {
		return false
	}
	ix.seen[key] = true
	ix.dirs = append(ix.dirs, d)
	return true
}

// lib is one soname's chosen library in a directory.
type lib struct {
	name, soname string
	isLink       bool
	flags        int32
}

// index lists the libraries of d as glibc's ldconfig (search_dir) does:
// files and links named lib*.so* or ld-*.so* (and ld.so.*, ld64.so.*)
// that are ELF shared objects, by soname (DT_SONAME, else the file name;
// a link leading to its soname's file, or a development link, by its own
// name); for one soname a file beats a link, then the newest name.
// (glibc 2.36 also indexes legacy hwcap subdirectories such as tls/;
// glibc 2.37 dropped them, and so does this.)
func (ix *indexer) index(d indexDir) ([]ldcache.Entry, error) {
	ents, err := ix.r.ReadDir(d.path, maxDirEntries)
	if errors.Is(err, errTooMany) {
		return nil, err
	}
	if err != nil {
		return nil, nil
	}
	var libs []*lib
	bySoname := map[string]*lib{}
	for _, e := range ents {
		name := e.Name()
		if !isDSOName(name) || strings.HasSuffix(name, ".#prelink#") || strings.Contains(name, ".#prelink#.") {
			continue
		}
		isLink := e.Type()&os.ModeSymlink != 0
		if !isLink && !e.Type().IsRegular() {
			continue
		}
		info, err := ix.readLib(path.Join(d.path, name))
		if err != nil {
			continue
		}
		soname := info.SOName
		if soname == "" {
			soname = name
		}
		// A link keeps its own name when it is the soname or the
		// development link (libfoo.so for libfoo.so.1); any other link
		// counts as one more file of its soname.
		if isLink && name != soname && (!strings.HasSuffix(name, ".so") || !strings.HasPrefix(soname, name)) {
			isLink = false
		}
		if isLink {
			soname = name
		}
		if !ldcache.Indexable(soname) {
			continue
		}
		l := bySoname[soname]
		if l == nil {
			l = &lib{name: name, soname: soname, isLink: isLink, flags: info.Flags}
			bySoname[soname] = l
			libs = append(libs, l)
			continue
		}
		if (!isLink && l.isLink) || (isLink == l.isLink && ldcache.Libcmp(l.name, name) < 0) {
			switch {
			case l.flags == ldcache.FlagELF && info.Flags == ldcache.FlagELFLibc6:
				l.flags = info.Flags
			case l.flags == ldcache.FlagELFLibc6 && info.Flags == ldcache.FlagELF:
				l.flags = info.Flags
			}
			l.name, l.isLink = name, isLink
		}
	}
	out := make([]ldcache.Entry, 0, len(libs))
	for _, l := range libs {
		file := l.name
		if d.hwcaps == "" && ix.same(path.Join(d.path, l.soname), path.Join(d.path, l.name)) {
			file = l.soname
		}
		out = append(out, ldcache.Entry{Flags: l.flags, Name: l.soname, Path: path.Join(d.path, file), HWCaps: d.hwcaps})
	}
	return out, nil
}

// isDSOName is glibc's _dl_is_dso.
func isDSOName(n string) bool {
	return ((strings.HasPrefix(n, "lib") || strings.HasPrefix(n, "ld-")) && strings.Contains(n, ".so")) ||
		strings.HasPrefix(n, "ld.so.") || strings.HasPrefix(n, "ld64.so.")
}

// readLib reads the ELF facts of the regular file p leads to inside the
// root.
func (ix *indexer) readLib(p string) (ldcache.ELFInfo, error) {
	f, err := ix.r.openRegular(p)
	if err != nil {
		return ldcache.ELFInfo{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ldcache.ELFInfo{}, err
	}
	return ldcache.ReadELF(f, st.Size())
}

// same reports whether a and b lead to one file inside the root.
func (ix *indexer) same(a, b string) bool {
	sa, err := ix.r.stat(a)
	if err != nil {
		return false
	}
	sb, err := ix.r.stat(b)
	return err == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
