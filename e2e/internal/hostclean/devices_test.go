package hostclean

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestEnsureDevicesCreatesOnlyWhatIsMissingAndRemovesOnlyItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	dir := t.TempDir()
	record := filepath.Join(dir, "record")
	path := func(n string) string { return filepath.Join(dir, n) }
	// A node that was there before (the host's own) is used, never removed.
	if err := unix.Mknod(path("ctl"), unix.S_IFCHR|0o600, int(unix.Mkdev(195, 255))); err != nil {
		t.Fatal(err)
	}
	want := []CharDevice{{path("ctl"), 195, 255}, {path("gpu0"), 195, 0}, {path("gpu1"), 195, 1}}
	if err := EnsureDevices(record, want); err != nil {
		t.Fatal(err)
	}
	for _, d := range want {
		var st unix.Stat_t
		if err := unix.Stat(d.Path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != d.Major || unix.Minor(st.Rdev) != d.Minor {
			t.Errorf("%s: %v, mode %o rdev %d:%d; want char %d:%d", d.Path, err, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), d.Major, d.Minor)
		}
	}
	// Fewer GPUs: the harness's gpu1 goes, the rest stays.
	if err := EnsureDevices(record, want[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path("gpu1")); !os.IsNotExist(err) {
		t.Errorf("gpu1 still there after the list dropped it: %v", err)
	}
	if err := RemoveDevices(record); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path("gpu0")); !os.IsNotExist(err) {
		t.Errorf("gpu0, created by the harness, survived RemoveDevices: %v", err)
	}
	if _, err := os.Stat(path("ctl")); err != nil {
		t.Errorf("ctl, there before, was removed: %v", err)
	}
	if _, err := os.Stat(record); !os.IsNotExist(err) {
		t.Errorf("record survived RemoveDevices: %v", err)
	}
}

func TestEnsureDevicesRefusesAPathThatIsSomethingElse(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	dir := t.TempDir()
	other := filepath.Join(dir, "gpu0")
	if err := os.WriteFile(other, []byte("not a device"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := EnsureDevices(filepath.Join(dir, "record"), []CharDevice{{other, 195, 0}})
	if err == nil || !strings.Contains(err.Error(), "is not character device 195:0") {
		t.Fatalf("EnsureDevices over a regular file = %v, want a refusal", err)
	}
	if b, _ := os.ReadFile(other); string(b) != "not a device" {
		t.Errorf("the file was touched: %q", b)
	}
}

// Nodes in a directory the host lacks (/dev/nvidia-caps): the directory is
// made, and goes with the last of them.
func TestEnsureDevicesMakesAndRemovesTheirDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	dir := t.TempDir()
	record := filepath.Join(dir, "record")
	caps := filepath.Join(dir, "nvidia-caps")
	want := []CharDevice{{filepath.Join(dir, "gpu0"), 195, 0}, {filepath.Join(caps, "nvidia-cap1"), 509, 1}, {filepath.Join(caps, "nvidia-cap2"), 509, 2}}
	if err := EnsureDevices(record, want); err != nil {
		t.Fatal(err)
	}
	if err := EnsureDevices(record, want); err != nil {
		t.Fatalf("second EnsureDevices: %v", err)
	}
	if _, err := os.Stat(want[2].Path); err != nil {
		t.Fatal(err)
	}
	if err := EnsureDevices(record, want[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(caps); !os.IsNotExist(err) {
		t.Errorf("%s survived once no node in it was wanted: %v", caps, err)
	}
	if err := EnsureDevices(record, want); err != nil {
		t.Fatal(err)
	}
	if err := RemoveDevices(record); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{caps, want[0].Path} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived RemoveDevices: %v", p, err)
		}
	}
}

// Nodes added at runtime (a MIG instance created later) join the record:
// what was created before stays, and RemoveDevices removes both.
func TestAddDevicesKeepsWhatWasThereAndRecordsTheNew(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	dir := t.TempDir()
	record := filepath.Join(dir, "record")
	caps := filepath.Join(dir, "nvidia-caps")
	first := []CharDevice{{filepath.Join(dir, "gpu0"), 195, 0}}
	if err := EnsureDevices(record, first); err != nil {
		t.Fatal(err)
	}
	added := []CharDevice{{filepath.Join(caps, "nvidia-cap12"), 509, 12}, {filepath.Join(caps, "nvidia-cap13"), 509, 13}}
	for range 2 {
		if err := AddDevices(record, added); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range append(first, added...) {
		if _, err := os.Stat(d.Path); err != nil {
			t.Errorf("%s: %v", d.Path, err)
		}
	}
	if err := RemoveDevices(record); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{caps, first[0].Path} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s survived RemoveDevices: %v", p, err)
		}
	}
}
