// Package backend opens the GPU inventory an --nvml value names: the real
// NVML library of the host's driver, or nvinject's SIMULATED node
// (shared/gpu/sim) for "sim:...". This is where the simulation is chosen
// for NVML; a Backend is the same product type either way and carries
// nothing of the simulation. The simulation's own controls (its Xids and
// faults) come only from OpenSimulated, which the simulation's seam for the
// kubelet plugins (gpunode/simdebug) calls.
//
// The simulation is linked only into builds without the nosim tag: the
// release binaries (make build) are built with it and cannot open "sim:"
// values; the test and demo equipment (make equipment) is built without.
package backend

import (
	"fmt"
	"log/slog"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/driverroot"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
)

// Real is the --nvml value for the host's NVML.
const Real = "real"

// Backend is an opened inventory.
type Backend struct {
	*nvmlinv.Inventory
}

// Options are the host paths the real backend reads.
type Options struct {
	// DriverRoot is where the driver's files are ("/" on a host install,
	// the mounted host root inside a container).
	DriverRoot string
	// DevRoot holds the host's /dev; defaults to DriverRoot when that is a
	// system root, else "/" (driverroot.DevRoot).
	DevRoot string
	// Logger gets what a SIMULATED node reports while it runs (a MIG state
	// file it cannot follow); default slog's default.
	Logger *slog.Logger
}

// Open returns the inventory value names ("real" or "sim:..."). A
// simulation reports the driver version of o.DriverRoot when that root
// holds a driver, unless the value's driver= option names one.
func Open(value string, o Options) (*Backend, error) {
	if value == "" {
		value = Real
	}
	if contract.IsSimulatedNVML(value) {
		return openSimulated(value, o)
	}
	if value != Real {
		return nil, fmt.Errorf("--nvml=%q is not valid: use %q for the host's GPUs or sim:a100-80gb[*N] for a simulated node", value, Real)
	}
	if o.DriverRoot == "" {
		o.DriverRoot = "/"
	}
	o.DevRoot = driverroot.DevRoot(o.DriverRoot, o.DevRoot)
	var libOpts []nvml.LibraryOption
	lib := "libnvidia-ml.so.1 from the host's loader path"
	if o.DriverRoot != "/" {
		// The root's own NVML, found inside the root (its links may be
		// absolute); without one the loader searches the host's places.
		if p := driverroot.FindLibrary(o.DriverRoot, "libnvidia-ml.so.1"); p != "" {
			libOpts = append(libOpts, nvml.WithLibraryPath(p))
			lib = p
		}
	}
	inv, err := nvmlinv.New(nvml.New(libOpts...), nvmlinv.WithNodeLookup(nvmlinv.StatLookup{Root: o.DevRoot}))
	if err != nil {
		return nil, fmt.Errorf("open NVML (%s, driver root %s): %w", lib, o.DriverRoot, err)
	}
	return &Backend{Inventory: inv}, nil
}

// Validate checks an --nvml value without opening anything: "real", or a
// SIMULATED node this build can simulate.
func Validate(value string) error {
	if value == "" || value == Real {
		return nil
	}
	if !contract.IsSimulatedNVML(value) {
		return fmt.Errorf("use %q for the host's GPUs or sim:a100-80gb[*N] for a simulated node", Real)
	}
	return validateSimulated(value)
}
