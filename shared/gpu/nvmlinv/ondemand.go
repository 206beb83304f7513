package nvmlinv

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/nvcaps"
)

// MIGSlots lists every placement of every GPU instance profile of GPU d
// (MIG mode on), with one compute instance over the whole GPU instance, as
// NVML's GetGpuInstancePossiblePlacements answers each profile. Profile
// variants with a suffix ("+me") are left out: they hold engines one
// instance at a time, which a placement cannot say.
func (i *Inventory) MIGSlots(d gpu.Device) ([]gpu.MIGSlot, error) {
	h, err := i.handle(d)
	if err != nil {
		return nil, err
	}
	profiles, err := gpuInstanceProfiles(d, h)
	if err != nil {
		return nil, err
	}
	var out []gpu.MIGSlot
	for _, p := range profiles {
		if profileSuffixes[p.id] != "" {
			continue
		}
		name, err := MIGProfileName(p.id, p.info, nvml.ComputeInstanceProfileInfo{SliceCount: p.info.SliceCount}, d.MemoryBytes)
		if errors.Is(err, ErrUnnamedProfile) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("GPU %s: %w", d.UUID, err)
		}
		info := p.info
		places, ret := h.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("read GPU %s's placements of %s", d.UUID, name), ret)
		}
		for _, at := range places {
			out = append(out, gpu.MIGSlot{
				Profile: name, GIProfile: p.id, Placement: gpu.MIGPlacement{Start: int(at.Start), Size: int(at.Size)},
				MemoryBytes: uint64(p.info.MemorySizeMB) << 20, GPUSlices: int(p.info.SliceCount), Multiprocessors: int(p.info.MultiprocessorCount),
			})
		}
	}
	return out, nil
}

// CreateMIG makes a GPU instance at slot on GPU d and its one compute
// instance over all its slices, as nvidia-smi mig -cgi -C does, and returns
// the MIG device as Discover would list it. A failure destroys what it
// made.
func (i *Inventory) CreateMIG(d gpu.Device, slot gpu.MIGSlot) (m gpu.MIGDevice, err error) {
	h, err := i.handle(d)
	if err != nil {
		return m, err
	}
	what := fmt.Sprintf("%s at slice %d on GPU %s", slot.Profile, slot.Placement.Start, d.UUID)
	info, ret := h.GetGpuInstanceProfileInfo(slot.GIProfile)
	if ret != nvml.SUCCESS {
		return m, nvmlErr("read the GPU instance profile of "+what, ret)
	}
	gi, ret := h.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(slot.Placement.Start), Size: uint32(slot.Placement.Size)})
	if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
		return m, fmt.Errorf("create GPU instance %s: its slices are taken by another GPU instance (nvidia-smi mig -lgi -i %d lists them); destroy it or let the claim get another placement", what, d.Index)
	}
	if ret != nvml.SUCCESS {
		return m, migChangeErr("create GPU instance "+what, ret)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, destroyGI(gi, what))
		}
	}()
	ciInfo, err := fullComputeInstance(gi, info.SliceCount, what)
	if err != nil {
		return m, err
	}
	if _, ret = gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		return m, migChangeErr("create the compute instance of "+what, ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return m, nvmlErr("read GPU instance "+what, ret)
	}
	if m, err = i.findMIG(d, h, int(giInfo.Id), what); err != nil {
		return m, err
	}
	return m, i.changed()
}

// ErrMIGConfigDenied: the driver refused this process the right to create
// or destroy MIG instances.
var ErrMIGConfigDenied = errors.New("no right to change MIG instances")

// migChangeErr is NVML's failure ret to make or destroy a MIG instance.
// A refusal (Insufficient Permissions) is ErrMIGConfigDenied with the fix:
// the driver's MIG config capability, which only a privileged container
// gets (NVIDIA's own runtime refuses NVIDIA_MIG_CONFIG_DEVICES outside one).
func migChangeErr(what string, ret nvml.Return) error {
	if ret != nvml.ERROR_NO_PERMISSION {
		return nvmlErr(what, ret)
	}
	return fmt.Errorf("NVML: %s: %v: %w: the driver grants it to a process that can open its MIG config capability (the /dev/nvidia-caps node %s names, nvidia-cap1); run the process privileged (nvinject-dra: deploy/components/dra-mig-on-demand, or the chart's dra.migOnDemand=true)",
		what, nvml.ErrorString(ret), ErrMIGConfigDenied, nvcaps.ConfigFile)
}

// changed shares a changed MIG layout (WithMIGChanged).
func (i *Inventory) changed() error {
	if i.migChanged == nil {
		return nil
	}
	if err := i.migChanged(); err != nil {
		return fmt.Errorf("share the changed MIG layout: %w", err)
	}
	return nil
}

// DestroyMIG destroys the GPU instance of slot's profile at slot's
// placement on GPU d and its compute instances, as nvidia-smi mig -dci and
// -dgi do. One that is already gone is no error.
func (i *Inventory) DestroyMIG(d gpu.Device, slot gpu.MIGSlot) error {
	h, err := i.handle(d)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("%s at slice %d on GPU %s", slot.Profile, slot.Placement.Start, d.UUID)
	info, ret := h.GetGpuInstanceProfileInfo(slot.GIProfile)
	if ret != nvml.SUCCESS {
		return nvmlErr("read the GPU instance profile of "+what, ret)
	}
	gis, ret := h.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		return nvmlErr("list the GPU instances of "+what, ret)
	}
	for _, gi := range gis {
		gInfo, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nvmlErr("read a GPU instance of "+what, ret)
		}
		if int(gInfo.Placement.Start) == slot.Placement.Start && int(gInfo.Placement.Size) == slot.Placement.Size {
			if err := destroyGI(gi, what); err != nil {
				return err
			}
			return i.changed()
		}
	}
	return nil
}

func (i *Inventory) handle(d gpu.Device) (nvml.Device, error) {
	h, ret := i.lib.DeviceGetHandleByIndex(d.Index)
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("open GPU %d (%s)", d.Index, d.UUID), ret)
	}
	if u, ret := h.GetUUID(); ret != nvml.SUCCESS || u != d.UUID {
		return nil, fmt.Errorf("GPU %d is no longer %s (NVML: %s, %s); the GPUs changed since discovery: restart nvinject", d.Index, d.UUID, u, nvml.ErrorString(ret))
	}
	return h, nil
}

// fullComputeInstance is the compute instance profile of gi that spans
// all its slices.
func fullComputeInstance(gi nvml.GpuInstance, slices uint32, what string) (nvml.ComputeInstanceProfileInfo, error) {
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && info.SliceCount == slices {
			return info, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("GPU instance %s lists no compute instance profile of %d slices; check the driver with nvidia-smi mig -lcip", what, slices)
}

// destroyGI destroys gi's compute instances, then gi.
func destroyGI(gi nvml.GpuInstance, what string) error {
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
				return migChangeErr("destroy a compute instance of "+what+" (a process may still use it)", ret)
			}
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
		return migChangeErr("destroy GPU instance "+what+" (a process may still use it)", ret)
	}
	return nil
}

// findMIG reads the MIG device of GPU instance gi on d back from NVML.
func (i *Inventory) findMIG(d gpu.Device, h nvml.Device, gi int, what string) (gpu.MIGDevice, error) {
	profiles, err := gpuInstanceProfiles(d, h)
	if err != nil {
		return gpu.MIGDevice{}, err
	}
	count, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return gpu.MIGDevice{}, nvmlErr(fmt.Sprintf("count GPU %s's MIG devices", d.UUID), ret)
	}
	caps := nvcaps.New(i.caps, i.capsWhere)
	for j := 0; j < count; j++ {
		m, ret := h.GetMigDeviceHandleByIndex(j)
		if ret != nvml.SUCCESS {
			continue
		}
		if id, ret := m.GetGpuInstanceId(); ret != nvml.SUCCESS || id != gi {
			continue
		}
		return migDevice(d, h, m, profiles, caps)
	}
	return gpu.MIGDevice{}, fmt.Errorf("%s was made but NVML lists no MIG device in it; check it with nvidia-smi -L", what)
}
