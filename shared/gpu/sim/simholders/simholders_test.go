package simholders

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// A fake /proc whose process 42 has the node open and 7 has a regular
// file: only 42 holds it, and only for its own device number.
func TestHolders(t *testing.T) {
	dir := t.TempDir()
	node := filepath.Join(dir, "nvidia-cap12")
	if err := syscall.Mknod(node, syscall.S_IFCHR|0o444, int(509<<8|12)); err != nil {
		t.Skipf("cannot create a device node here (needs root): %v", err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	proc := filepath.Join(dir, "proc")
	for pid, target := range map[string]string{"42": node, "7": plain} {
		if err := os.MkdirAll(filepath.Join(proc, pid, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(proc, pid, "fd", "3")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(proc, "self-not-a-pid"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		major, minor int64
		want         []int
	}{
		{509, 12, []int{42}},
		{509, 13, nil},
		{195, 12, nil},
	} {
		got, err := Holders(proc, tc.major, tc.minor)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("Holders(%d:%d) = %v, %v; want %v", tc.major, tc.minor, got, err, tc.want)
		}
	}
}
