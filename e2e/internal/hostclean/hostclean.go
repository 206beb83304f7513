// Package hostclean removes what a node leaves on the host outside its own processes:
// mounts, cgroups and stray processes, so teardown can prove nothing remains.
package hostclean

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// MountsUnder lists mount points at or below dir, deepest first.
func MountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescape(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, sc.Err()
}

// UnmountUnder unmounts everything at or below dir, deepest first. Stacked mounts on the
// same point (kubelet bind-mounts its root dir onto itself) are unmounted until none remain.
func UnmountUnder(dir string) error {
	for range 10 {
		mounts, err := MountsUnder(dir)
		if err != nil || len(mounts) == 0 {
			return err
		}
		for _, mp := range mounts {
			if err := syscall.Unmount(mp, 0); err != nil {
				// A busy mount goes away once its last user does.
				_ = syscall.Unmount(mp, syscall.MNT_DETACH)
			}
		}
	}
	mounts, err := MountsUnder(dir)
	if err == nil && len(mounts) > 0 {
		return fmt.Errorf("mounts remain under %s: %v; unmount them by hand", dir, mounts)
	}
	return err
}

// RemoveCgroups removes the named cgroup trees (e.g. "kubepods") from every cgroup v1
// hierarchy, or from the unified hierarchy, deepest first. Only empty cgroups can be removed,
// so a tree that still holds a process is reported.
func RemoveCgroups(names ...string) error { return removeCgroups(false, names) }

// KillAndRemoveCgroups is RemoveCgroups that first kills processes left in the trees
// (orphans of a killed shim). Use it only for trees nothing else on the host uses.
func KillAndRemoveCgroups(names ...string) error { return removeCgroups(true, names) }

func removeCgroups(kill bool, names []string) error {
	var errs []error
	for _, root := range CgroupRoots() {
		for _, name := range names {
			if err := removeTree(filepath.Join(root, name), kill); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// CgroupsLeft lists which of the named cgroup trees still exist.
func CgroupsLeft(names ...string) []string {
	var left []string
	for _, root := range CgroupRoots() {
		for _, name := range names {
			if _, err := os.Stat(filepath.Join(root, name)); err == nil {
				left = append(left, filepath.Join(root, name))
			}
		}
	}
	return left
}

// CgroupRoots are the cgroup v1 hierarchies' mount points, or the unified hierarchy.
func CgroupRoots() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var roots []string
	for _, e := range entries {
		if e.IsDir() {
			roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return roots
}

func removeTree(top string, kill bool) error {
	var dirs []string
	err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("walk cgroup %s: %w", top, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if kill {
			killMembers(dirs[i])
		}
		if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("remove cgroup %s (a process may still be in it): %w", dirs[i], err)
		}
	}
	return nil
}

// killMembers SIGKILLs processes left in a cgroup (orphans of a killed shim), since
// only an empty cgroup can be removed.
func killMembers(dir string) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return
	}
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for range 50 {
		if data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err != nil || len(bytes.TrimSpace(data)) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Processes lists live pids whose command line contains every one of the given words.
func Processes(words ...string) []int {
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		match := true
		for _, w := range words {
			if !bytes.Contains(cmdline, []byte(w)) {
				match = false
				break
			}
		}
		if match {
			pids = append(pids, pid)
		}
	}
	return pids
}

// unescape decodes the octal escapes (\040 for space) the kernel uses in mountinfo.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// RemoveRunDir deletes everything in a run dir except its logs, which stay
// for whoever reads why a run failed.
func RemoveRunDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read run dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if e.Name() == "logs" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove %s (is something still mounted there?): %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}
