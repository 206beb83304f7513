// Package backend opens the GPU inventory an --nvml value names: the real
// NVML library of the host's driver, or nvinject's SIMULATED node
// (shared/gpu/sim) for "sim:...". This is where the simulation is chosen
// for NVML; a Backend is the same product type either way and carries
// nothing of the simulation. The simulation's own controls (its Xids and
// faults) come only from OpenSimulated, which the simulation's seam for the
// kubelet plugins (gpunode/simdebug) calls.
package backend

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/driverroot"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
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
	if sim.IsSim(value) {
		b, _, err := OpenSimulated(value, o)
		return b, err
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

// OpenSimulated is Open for a SIMULATED node ("sim:..."), and also returns
// the simulated node itself: the equipment that injects its Xids and faults.
// With a driver root the node follows the root's simulated MIG state file
// (sim.StateFile), so every process opening the root sees one MIG layout.
func OpenSimulated(value string, o Options) (*Backend, *sim.Node, error) {
	value, err := sim.Resolve(value, o.DriverRoot)
	if err != nil {
		return nil, nil, err
	}
	spec, err := sim.ParseSpec(value)
	if err != nil {
		return nil, nil, err
	}
	source, err := simDriver(&spec, value, o.DriverRoot)
	if err != nil {
		return nil, nil, err
	}
	opts := []sim.Option{}
	if o.Logger != nil {
		opts = append(opts, sim.WithLogger(o.Logger))
	}
	if o.DriverRoot != "" {
		// Every process opening this driver root shares one MIG layout.
		opts = append(opts, sim.WithStateFile(filepath.Join(o.DriverRoot, sim.StateFile)))
	}
	node := sim.New(spec, opts...)
	inv, err := nvmlinv.New(node.NVML(), nvmlinv.WithNodeLookup(node.Nodes()), nvmlinv.WithCaps(node.ProcFS(), "the SIMULATED driver's procfs"),
		nvmlinv.WithSimulated(), nvmlinv.WithDriverSource(source))
	if err != nil {
		return nil, nil, err
	}
	return &Backend{Inventory: inv}, node, nil
}

// simDriver settles the simulated driver version: the value's driver=
// option, else the version of the driver in root, else the simulation's
// default. It returns where the version came from.
func simDriver(spec *sim.Spec, value, root string) (string, error) {
	if spec.Driver != "" {
		return fmt.Sprintf("SIMULATED, the driver= option of %s", value), nil
	}
	if root != "" {
		v, ok, err := driverroot.DriverVersion(root)
		if err != nil {
			return "", fmt.Errorf("--nvml=%s follows the driver root's version: %w; or give the version with %s,driver=VERSION", value, err, value)
		}
		if ok {
			if _, known := sim.CUDAVersionFor(v.Version); !known {
				return "", fmt.Errorf("--nvml=%s: driver root %s holds driver %s (%s), older than the simulation knows; simulate another with %s,driver=VERSION", value, root, v.Version, v.File, value)
			}
			spec.Driver = v.Version
			return fmt.Sprintf("SIMULATED, following the driver root %s: %s", root, v.File), nil
		}
	}
	return fmt.Sprintf("SIMULATED, %s default", value), nil
}
