//go:build !nosim

// Package simholders finds the processes that hold a character device
// open, as the real NVIDIA driver knows who holds a MIG instance's
// /dev/nvidia-caps access node. It is SIMULATION equipment: the simulated
// driver (shared/gpu/sim) and the simulated nvidia-smi refuse destroying a
// MIG instance in use with it. It has no dependencies so that the
// simulated nvidia-smi builds static.
package simholders

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
)

// Proc is the host's /proc.
const Proc = "/proc"

// Holders returns the IDs of the processes under procRoot (a /proc) with
// an open file descriptor on the character device major:minor, matched by
// the device number of what each /proc/PID/fd link opens, so a node made
// in a container's /dev counts as the host's. Processes that vanish or
// whose descriptors cannot be read are skipped.
func Holders(procRoot string, major, minor int64) ([]int, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("list the processes in %s: %w", procRoot, err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(filepath.Join(procRoot, e.Name(), "fd"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				continue
			}
			return nil, fmt.Errorf("read %s's descriptors: %w", e.Name(), err)
		}
		for _, fd := range fds {
			var st syscall.Stat_t
			if syscall.Stat(filepath.Join(procRoot, e.Name(), "fd", fd.Name()), &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
				continue
			}
			if devMajor(uint64(st.Rdev)) == major && devMinor(uint64(st.Rdev)) == minor {
				out = append(out, pid)
				break
			}
		}
	}
	sort.Ints(out)
	return out, nil
}

func devMajor(rdev uint64) int64 { return int64((rdev>>8)&0xfff) | int64((rdev>>32)&^0xfff) }
func devMinor(rdev uint64) int64 { return int64(rdev&0xff) | int64((rdev>>12)&^0xff) }
