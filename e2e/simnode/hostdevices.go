package simnode

import (
	"context"
	"fmt"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/e2e/internal/simdev"
	"github.com/nvinject/nvinject/e2e/nvctk"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// HostDevices are the device nodes a host with gpus NVIDIA GPUs and the
// driver loaded has, with the numbers the simulation's CDI spec writes out
// (shared/gpu/sim's Lookup): /dev/nvidiactl and /dev/nvidia-modeset on
// major 195, /dev/nvidia0..N-1, and /dev/nvidia-uvm(-tools) on the UVM
// major, dynamic on a real host (/proc/devices) and the simulation's 508
// here. The local node's host gets them, so a privileged pod sees what it
// would on a real GPU node.
func HostDevices(gpus int) []hostclean.CharDevice {
	devs := []hostclean.CharDevice{
		{Path: "/dev/nvidiactl", Major: gpu.NVIDIAMajor, Minor: gpu.CtlMinor},
		{Path: "/dev/nvidia-modeset", Major: gpu.NVIDIAMajor, Minor: gpu.ModesetMinor},
		{Path: "/dev/nvidia-uvm", Major: nvctk.UVMMajor, Minor: 0},
		{Path: "/dev/nvidia-uvm-tools", Major: nvctk.UVMMajor, Minor: 1},
	}
	for i := range gpus {
		devs = append(devs, hostclean.CharDevice{Path: fmt.Sprintf("/dev/nvidia%d", i), Major: gpu.NVIDIAMajor, Minor: uint32(i)})
	}
	return devs
}

// MIGHostDevices are the /dev/nvidia-caps nodes a host with the simulated
// node nvml has: MIG's config and monitor nodes and each MIG device's GI
// and CI access nodes, as the simulated NVML's discovery names them (the
// numbers the CDI spec writes out). None without a MIG GPU.
func MIGHostDevices(ctx context.Context, nvml string) ([]hostclean.CharDevice, error) {
	node, err := SimulatedGPUs(ctx, nvml)
	if err != nil {
		return nil, err
	}
	return simdev.MIGNodes(node, "/"), nil
}

// SimulatedGPUs is what the daemons' simulated NVML discovers for nvml: the
// same deterministic UUIDs, MIG devices and access nodes.
func SimulatedGPUs(ctx context.Context, nvml string) (gpu.Node, error) {
	b, err := backend.Open(nvml, backend.Options{})
	if err != nil {
		return gpu.Node{}, fmt.Errorf("open the SIMULATED node %s: %w", nvml, err)
	}
	defer b.Close()
	node, err := b.Discover(ctx)
	if err != nil {
		return gpu.Node{}, fmt.Errorf("discover the SIMULATED node %s: %w", nvml, err)
	}
	return node, nil
}
