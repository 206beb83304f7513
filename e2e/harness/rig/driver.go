package rig

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nvinject/nvinject/e2e/harness/driverroot"
	shareddriverroot "github.com/nvinject/nvinject/shared/driverroot"
)

// Simulated is the Driver layout of the SIMULATED driver root: placeholder
// libraries and nvidia-smi-sim as nvidia-smi (nvinject-cdi simulate-driver-root).
const Simulated = "simulated"

// SimFacts is the SIMULATED GPUs' facts file inside the driver root (the
// generator puts it into GPU containers; nvidia-smi-sim reads it).
const SimFacts = "usr/share/nvinject/simulated-gpus.json"

// Driver is the driver root the node's host gets: NVIDIA's REAL driver user
// space without a kernel module (e2e/harness/driverroot, flat or debian layout), or the
// SIMULATED placeholder root. Either way the GPU itself is simulated
// (sim:a100-80gb); with the real root its NVML reports the root's driver version.
type Driver struct {
	// Layout is driverroot.Flat, driverroot.Debian or Simulated.
	Layout string
	// Source is the real root (the machine-wide cache), copied onto the host's
	// DriverRoot; empty for the simulated root.
	Source string
	// Why says why the simulated root is used.
	Why string
	// Version is the real root's driver version; empty means driverroot.DriverVersion.
	Version string
}

// Real reports whether the node gets NVIDIA's real driver user space.
func (d Driver) Real() bool { return d.Layout != Simulated && d.Layout != "" }

// String is the plain statement printed before a run.
func (d Driver) String() string {
	if !d.Real() {
		why := d.Why
		if why == "" {
			why = "DRIVER_LAYOUT=" + Simulated
		}
		return "SIMULATED driver root: " + why + "; its libraries are placeholders and nvidia-smi is nvidia-smi-sim"
	}
	return fmt.Sprintf("REAL NVIDIA driver user space %s (%s layout, no kernel module) from %s; the GPU is SIMULATED", cmp.Or(d.Version, driverroot.DriverVersion), d.Layout, d.Source)
}

// ChooseDriver resolves layout (flat, the default; debian; simulated). A real
// layout is built or taken from the machine-wide cache (build.sh's progress goes
// to log); when Debian's archive cannot be reached and nothing is cached, the
// simulated root is used and Why says so. Other failures are errors.
func ChooseDriver(ctx context.Context, layout string, log io.Writer) (Driver, error) {
	return ChooseDriverVersion(ctx, driverroot.DriverVersion, layout, log)
}

// ChooseDriverVersion is ChooseDriver for the real root of driver version (one of
// driverroot.Versions).
func ChooseDriverVersion(ctx context.Context, version, layout string, log io.Writer) (Driver, error) {
	switch layout {
	case "":
		layout = driverroot.Flat
	case Simulated:
		return Driver{Layout: Simulated, Why: "DRIVER_LAYOUT=" + Simulated}, nil
	case driverroot.Flat, driverroot.Debian:
	default:
		return Driver{}, fmt.Errorf("DRIVER_LAYOUT=%q: use %s, %s or %s", layout, driverroot.Flat, driverroot.Debian, Simulated)
	}
	root, err := driverroot.RootOfWithLog(ctx, version, layout, log)
	if errors.Is(err, driverroot.ErrUnavailable) {
		return Driver{Layout: Simulated, Why: fmt.Sprintf("Debian archive unreachable (%s)", oneLine(err.Error()))}, nil
	}
	if err != nil {
		return Driver{}, fmt.Errorf("real driver root (%s layout): %w; DRIVER_LAYOUT=%s runs on the simulated root", layout, err, Simulated)
	}
	return Driver{Layout: layout, Source: root, Version: version}, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// writeRealDriverRoot copies the real root into DriverRoot (emptied by the
// caller) and adds the SIMULATED GPUs' facts file that nvidia-smi-sim reads,
// for nvml with the real root's driver version. The real nvidia-smi stays.
func (d *Deployer) writeRealDriverRoot(ctx context.Context, dir, nvml string, drv Driver) error {
	if out, err := exec.CommandContext(ctx, "cp", "-a", drv.Source+"/.", dir+"/").CombinedOutput(); err != nil {
		return fmt.Errorf("copy the real driver root %s to %s: %w: %s", drv.Source, dir, err, out)
	}
	version, ok, err := shareddriverroot.DriverVersion(drv.Source)
	if err != nil || !ok {
		return fmt.Errorf("driver version of the real root %s (found: %t): %v; rebuild it with make driver-root", drv.Source, ok, err)
	}
	tmp, err := os.MkdirTemp("", "nvinject-simfacts-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	withDriver := nvml + ",driver=" + version.Version
	out, err := exec.CommandContext(ctx, d.Bin("nvinject-cdi"), "simulate-driver-root", "--nvml="+withDriver,
		"--smi="+d.Bin("nvidia-smi-sim"), tmp).CombinedOutput()
	if err != nil {
		return fmt.Errorf("simulated GPU facts for %s: %w: %s; run `make build`", withDriver, err, out)
	}
	facts, err := os.ReadFile(filepath.Join(tmp, SimFacts))
	if err != nil {
		return fmt.Errorf("simulated GPU facts for %s: %w", withDriver, err)
	}
	dst := filepath.Join(dir, SimFacts)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(dst, facts, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", dst, err)
	}
	return nil
}
