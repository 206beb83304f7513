//go:build !nosim

package backend

import (
	"fmt"
	"path/filepath"

	"github.com/nvinject/nvinject/shared/driverroot"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// Simulation says whether this build links the GPU simulation.
const Simulation = true

func openSimulated(value string, o Options) (*Backend, error) {
	b, _, err := OpenSimulated(value, o)
	return b, err
}

func validateSimulated(value string) error {
	if value == sim.FromDriverRoot {
		return nil
	}
	_, err := sim.ParseSpec(value)
	return err
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
	invOpts := []nvmlinv.Option{nvmlinv.WithNodeLookup(node.Nodes()), nvmlinv.WithCaps(node.ProcFS(), "the SIMULATED driver's procfs"),
		nvmlinv.WithSimulated(), nvmlinv.WithDriverSource(source)}
	if o.DriverRoot != "" {
		// MIG devices made on demand join the layout every process follows.
		invOpts = append(invOpts, nvmlinv.WithMIGChanged(func() error { _, err := node.SaveState(); return err }))
	}
	inv, err := nvmlinv.New(node.NVML(), invOpts...)
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
