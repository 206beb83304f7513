// Package backend opens the GPU inventory an --nvml value names: the real
// NVML library of the host's driver, or nvinject's simulated node.
package backend

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// Real is the --nvml value for the host's NVML.
const Real = "real"

// Backend is an opened inventory; Sim is set only for a simulated node.
type Backend struct {
	*nvmlinv.Inventory
	Sim *sim.Node
}

// Options are the host paths the real backend reads.
type Options struct {
	// DriverRoot is where the driver's files are ("/" on a host install,
	// the mounted host root inside a container).
	DriverRoot string
	// DevRoot holds the host's /dev; defaults to DriverRoot.
	DevRoot string
}

// LibDirs are the directories, under a driver root, searched for NVML.
var LibDirs = []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "lib/x86_64-linux-gnu"}

// Open returns the inventory value names ("real" or "sim:...").
func Open(value string, o Options) (*Backend, error) {
	if value == "" {
		value = Real
	}
	if sim.IsSim(value) {
		spec, err := sim.ParseSpec(value)
		if err != nil {
			return nil, err
		}
		node := sim.New(spec)
		inv, err := nvmlinv.New(node.NVML(), nvmlinv.WithNodeLookup(node.Nodes()), nvmlinv.WithSimulated())
		if err != nil {
			return nil, err
		}
		return &Backend{Inventory: inv, Sim: node}, nil
	}
	if value != Real {
		return nil, fmt.Errorf("--nvml=%q is not valid: use %q for the host's GPUs or sim:a100-80gb[*N] for a simulated node", value, Real)
	}
	if o.DriverRoot == "" {
		o.DriverRoot = "/"
	}
	if o.DevRoot == "" {
		o.DevRoot = o.DriverRoot
	}
	var libOpts []nvml.LibraryOption
	if p := findLib(o.DriverRoot); p != "" {
		libOpts = append(libOpts, nvml.WithLibraryPath(p))
	}
	inv, err := nvmlinv.New(nvml.New(libOpts...), nvmlinv.WithNodeLookup(nvmlinv.StatLookup{Root: o.DevRoot}))
	if err != nil {
		return nil, fmt.Errorf("open NVML (driver root %s): %w", o.DriverRoot, err)
	}
	return &Backend{Inventory: inv}, nil
}

// findLib returns NVML's path under a non-/ driver root, or "" to let the
// dynamic loader search the host's usual places.
func findLib(root string) string {
	if root == "/" {
		return ""
	}
	for _, d := range LibDirs {
		p := filepath.Join(root, d, "libnvidia-ml.so.1")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}
