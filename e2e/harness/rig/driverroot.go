package rig

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// WriteDriverRoot writes the driver root for nvml (sim:a100-80gb[*N]) at
// DriverRoot and makes it a shared mount (see shareDriverRoot): with a real
// Driver, a copy of NVIDIA's user space plus the SIMULATED GPUs' facts file;
// otherwise the SIMULATED root, with nvidia-smi-sim as its nvidia-smi.
func (d *Deployer) WriteDriverRoot(ctx context.Context, nvml string) error {
	if err := d.writeDriverRootAt(ctx, DriverRoot, nvml, d.driver); err != nil {
		return err
	}
	return shareDriverRoot()
}

// writeDriverRootAt writes the driver root for nvml from drv into dir (emptied in place:
// it may be a mount point) and names nvml in its sim.NodeFile, for --nvml=sim:driver-root.
func (d *Deployer) writeDriverRootAt(ctx context.Context, dir, nvml string, drv Driver) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create driver root %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read driver root %s: %w", dir, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("empty driver root %s: %w", dir, err)
		}
	}
	if drv.Real() {
		if err := d.writeRealDriverRoot(ctx, dir, nvml, drv); err != nil {
			return err
		}
		d.log.Info("real driver root copied, simulated GPU facts added", "dir", dir, "layout", drv.Layout, "from", drv.Source, "nvml", nvml)
	} else {
		out, err := exec.CommandContext(ctx, d.Bin("nvinject-cdi"), "simulate-driver-root", "--nvml="+nvml,
			"--smi="+d.Bin("nvidia-smi-sim"), dir).CombinedOutput()
		if err != nil {
			return fmt.Errorf("write simulated driver root %s: %w: %s; run `make build`", dir, err, out)
		}
		d.log.Info("simulated driver root written", "dir", dir, "nvml", nvml)
	}
	node := filepath.Join(dir, sim.NodeFile)
	if err := os.MkdirAll(filepath.Dir(node), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(node, []byte(nvml+"\n"), 0o644); err != nil {
		return fmt.Errorf("name the simulated node in %s: %w", node, err)
	}
	return nil
}

// shareDriverRoot bind-mounts DriverRoot onto itself as a shared mount. The
// device plugin mounts it with HostToContainer propagation, which containerd
// allows only from a shared or slave mount; a systemd host's / is shared, this
// kind of machine's / is private.
func shareDriverRoot() error {
	mounted, err := isMountPoint(DriverRoot)
	if err != nil {
		return err
	}
	if !mounted {
		if err := syscall.Mount(DriverRoot, DriverRoot, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount %s onto itself: %w", DriverRoot, err)
		}
	}
	if err := syscall.Mount("", DriverRoot, "", syscall.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", DriverRoot, err)
	}
	return nil
}

// RemoveDriverRoot unmounts and removes the driver root.
func RemoveDriverRoot() error {
	mounted, err := isMountPoint(DriverRoot)
	if err != nil {
		return err
	}
	if mounted {
		if err := syscall.Unmount(DriverRoot, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", DriverRoot, err)
		}
	}
	if err := os.RemoveAll(DriverRoot); err != nil {
		return fmt.Errorf("remove %s: %w", DriverRoot, err)
	}
	return nil
}

func isMountPoint(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// Field 5 is the mount point.
		if fields := strings.Fields(s.Text()); len(fields) > 4 && fields[4] == dir {
			return true, nil
		}
	}
	if err := s.Err(); err != nil && !errors.Is(err, os.ErrClosed) {
		return false, fmt.Errorf("read mounts: %w", err)
	}
	return false, nil
}
