package hostclean

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// CharDevice is a character device node on the host.
type CharDevice struct {
	Path         string
	Major, Minor uint32
}

// EnsureDevices makes the host hold exactly want among the device nodes
// listed in record: it creates each missing node (mode 0666, as NVIDIA's
// driver does) and records it, and removes recorded nodes want no longer
// names. A node that already exists as the same character device is used
// and never recorded, so it outlives the caller; a path that exists as
// anything else belongs to someone else and is an error.
func EnsureDevices(record string, want []CharDevice) error {
	created, err := recorded(record)
	if err != nil {
		return err
	}
	var keep, dirs []string
	for _, p := range created {
		if dir, ok := strings.CutSuffix(p, "/"); ok {
			dirs = append(dirs, dir)
			continue
		}
		if slices.ContainsFunc(want, func(d CharDevice) bool { return d.Path == p }) {
			keep = append(keep, p)
		} else if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove device node %s this harness created: %w", p, err)
		}
	}
	// A directory it made (/dev/nvidia-caps) goes once no wanted node is in it.
	for _, dir := range dirs {
		if slices.ContainsFunc(want, func(d CharDevice) bool { return filepath.Dir(d.Path) == dir }) {
			keep = append(keep, dir+"/")
		} else if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove directory %s this harness created: %w", dir, err)
		}
	}
	return createDevices(record, keep, want)
}

// AddDevices creates each of devs that is missing and records it, as
// EnsureDevices does, and removes nothing: the nodes of a MIG instance
// created at runtime join what the harness created. An empty record
// records nothing.
func AddDevices(record string, devs []CharDevice) error {
	created, err := recorded(record)
	if err != nil {
		return err
	}
	return createDevices(record, created, devs)
}

// createDevices creates the missing nodes of want (and their directory),
// recording each beside keep before it makes it.
func createDevices(record string, keep []string, want []CharDevice) error {
	for _, d := range want {
		if dir := filepath.Dir(d.Path); !slices.Contains(keep, dir+"/") {
			if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
				keep = append(keep, dir+"/")
				if err := writeRecord(record, keep); err != nil {
					return err
				}
				if err := os.Mkdir(dir, 0o755); err != nil {
					return fmt.Errorf("create directory %s for device nodes: %w", dir, err)
				}
			}
		}
		var st unix.Stat_t
		err := unix.Stat(d.Path, &st)
		if err == nil {
			if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != d.Major || unix.Minor(st.Rdev) != d.Minor {
				return fmt.Errorf("%s exists but is not character device %d:%d: it is not this harness's; remove it or run where it is absent", d.Path, d.Major, d.Minor)
			}
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("stat %s: %w", d.Path, err)
		}
		// Record before creating, so a failure halfway leaves nothing unlisted.
		keep = append(keep, d.Path)
		if err := writeRecord(record, keep); err != nil {
			return err
		}
		if err := unix.Mknod(d.Path, unix.S_IFCHR|0o666, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
			// Not ours after all (another process may have made it since the stat).
			_ = writeRecord(record, keep[:len(keep)-1])
			return fmt.Errorf("create device node %s (%d:%d; needs root): %w", d.Path, d.Major, d.Minor, err)
		}
		// mknod applies the umask.
		if err := os.Chmod(d.Path, 0o666); err != nil {
			return fmt.Errorf("chmod %s: %w", d.Path, err)
		}
	}
	return writeRecord(record, keep)
}

// RemoveDevices removes the device nodes listed in record, then record.
func RemoveDevices(record string) error {
	created, err := recorded(record)
	if err != nil {
		return err
	}
	var errs []error
	// Nodes before the directories that hold them.
	slices.SortStableFunc(created, func(a, b string) int {
		return strings.Count(strings.TrimSuffix(b, "/"), "/") - strings.Count(strings.TrimSuffix(a, "/"), "/")
	})
	for _, p := range created {
		if err := os.Remove(strings.TrimSuffix(p, "/")); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove device node %s this harness created: %w", p, err))
		}
	}
	if len(errs) == 0 {
		if err := os.Remove(record); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func recorded(record string) ([]string, error) {
	if record == "" {
		return nil, nil
	}
	data, err := os.ReadFile(record)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the list of created device nodes: %w", err)
	}
	return strings.Fields(string(data)), nil
}

func writeRecord(record string, paths []string) error {
	if record == "" {
		return nil
	}
	if err := os.WriteFile(record, []byte(strings.Join(paths, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("record created device nodes in %s: %w", record, err)
	}
	return nil
}
