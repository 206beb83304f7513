package rig

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/nvinject/nvinject/e2e/harness/nvctk"
	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/e2e/internal/simdev"
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

// ChangeMIG creates GPU instances of profiles, each with its full compute
// instance, on simulated GPU gpu of the deployed node nvml while nvinject
// runs, as an operator does with nvidia-smi: bin/sim-mig mig -cgi
// ... -C writes the driver root's SIMULATED MIG state, which every daemon
// follows, and gives the host the new caps nodes, recorded for Down. It
// returns the command's output, which names the new MIG UUIDs.
func (d *Deployer) ChangeMIG(ctx context.Context, nvml string, gpu int, profiles ...string) (string, error) {
	return d.simMIG(ctx, nvml, "-cgi", strings.Join(profiles, ","), "-C", "-i", strconv.Itoa(gpu))
}

// DestroyMIG destroys GPU instances gis (all without any) of simulated GPU
// gpu with their compute instances, as nvidia-smi mig -dci -dgi does; one
// a process holds is refused (In use by another client).
func (d *Deployer) DestroyMIG(ctx context.Context, nvml string, gpu int, gis ...int) (string, error) {
	args := []string{"-dci", "-dgi", "-i", strconv.Itoa(gpu)}
	if len(gis) > 0 {
		ids := make([]string, len(gis))
		for i, g := range gis {
			ids[i] = strconv.Itoa(g)
		}
		args = append(args, "-gi", strings.Join(ids, ","))
	}
	return d.simMIG(ctx, nvml, args...)
}

func (d *Deployer) simMIG(ctx context.Context, nvml string, mig ...string) (string, error) {
	argv := append([]string{"--driver-root=" + DriverRoot, "--nvml=" + nvml, "--record=" + d.node.HostDevicesRecord(), "mig"}, mig...)
	out, err := exec.CommandContext(ctx, d.Bin("sim-mig"), argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("sim-mig %s: %w: %s", strings.Join(argv, " "), err, out)
	}
	return string(out), nil
}
