package sim

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// The simulated driver refuses destroying a MIG instance whose compute
// instance access node a process holds open, as the real one answers
// NVML_ERROR_IN_USE; once the process lets go, the destroy goes through.
func TestDestroyInUseIsRefused(t *testing.T) {
	spec, err := ParseSpec("sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	proc := filepath.Join(dir, "proc")
	n := New(spec, WithProcRoot(proc))
	dev := filepath.Join(dir, "nvidia-cap")
	// GI 1 (the 1g.10gb) of GPU 1, its CI 0.
	if err := syscall.Mknod(dev, syscall.S_IFCHR|0o444, CapsMajor<<8|ciMinor(1, 1, 0)); err != nil {
		t.Skipf("cannot create a device node here (needs root): %v", err)
	}
	fd := filepath.Join(proc, "4242", "fd", "7")
	if err := os.MkdirAll(filepath.Dir(fd), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dev, fd); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		gi      int
		wantErr error
	}{
		{"the held instance", 1, ErrInUse},
		{"an instance nobody holds", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := n.DestroyGPUInstance(1, tc.gi); !errors.Is(err, tc.wantErr) {
				t.Fatalf("DestroyGPUInstance(1, %d) = %v, want %v", tc.gi, err, tc.wantErr)
			}
		})
	}
	if got := len(instances(n.server.Devices[1].(*server.Device))); got != 1 {
		t.Fatalf("GPU 1 has %d instances after the refusal, want the held one", got)
	}
	if err := os.Remove(fd); err != nil {
		t.Fatal(err)
	}
	if err := n.DestroyGPUInstance(1, 1); err != nil {
		t.Errorf("destroy once nobody holds it: %v", err)
	}
}
