// Package simdev lists the /dev/nvidia-caps nodes a host with a SIMULATED
// MIG layout has: what NVIDIA's nvidia-modprobe creates for the real
// driver's MIG instances, with the numbers the simulation's discovery (and
// so its CDI spec) names.
package simdev

import (
	"path/filepath"
	"slices"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/shared/gpu"
)

// MIGNodes are node's MIG config and monitor nodes and each MIG device's
// GI and CI access nodes, under devRoot ("/" for the host's /dev). None
// without a MIG GPU.
func MIGNodes(node gpu.Node, devRoot string) []hostclean.CharDevice {
	var devs []hostclean.CharDevice
	add := func(n gpu.DeviceNode) {
		p := filepath.Join(devRoot, n.Path)
		if n.Path != "" && !slices.ContainsFunc(devs, func(d hostclean.CharDevice) bool { return d.Path == p }) {
			devs = append(devs, hostclean.CharDevice{Path: p, Major: uint32(n.Major), Minor: uint32(n.Minor)})
		}
	}
	add(node.MIGConfig)
	add(node.MIGMonitor)
	for _, d := range node.Devices {
		for _, m := range d.MIG {
			add(m.GIAccess)
			add(m.CIAccess)
		}
	}
	return devs
}
