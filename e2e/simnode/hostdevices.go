package simnode

import (
	"fmt"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/e2e/nvctk"
	"github.com/nvinject/nvinject/shared/gpu"
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
