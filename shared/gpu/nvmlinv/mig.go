package nvmlinv

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/nvcaps"
)

// migDevices lists the MIG devices on a GPU with MIG mode on, walking
// NVML's MIG handles as go-nvlib's VisitMigDevices does.
func migDevices(d gpu.Device, h nvml.Device, caps *nvcaps.Reader) ([]gpu.MIGDevice, error) {
	count, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, nvmlErr(fmt.Sprintf("count GPU %s's MIG devices", d.UUID), ret)
	}
	profiles, err := gpuInstanceProfiles(d, h)
	if err != nil {
		return nil, err
	}
	var out []gpu.MIGDevice
	for j := 0; j < count; j++ {
		m, ret := h.GetMigDeviceHandleByIndex(j)
		// NVML numbers MIG slots up to the maximum; an empty one answers
		// NOT_FOUND (INVALID_ARGUMENT on some drivers).
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("open GPU %s's MIG device %d", d.UUID, j), ret)
		}
		md, err := migDevice(d, h, m, profiles, caps)
		if err != nil {
			return nil, err
		}
		out = append(out, md)
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].GPUInstance != out[b].GPUInstance {
			return out[a].GPUInstance < out[b].GPUInstance
		}
		return out[a].ComputeInstance < out[b].ComputeInstance
	})
	return out, nil
}

// giProfile is a GPU instance profile a GPU supports: the NVML profile
// constant it was asked for (which names its variant) and what NVML says.
type giProfile struct {
	id   int
	info nvml.GpuInstanceProfileInfo
}

func gpuInstanceProfiles(d gpu.Device, h nvml.Device) ([]giProfile, error) {
	var out []giProfile
	for p := 0; p < nvml.GPU_INSTANCE_PROFILE_COUNT; p++ {
		info, ret := h.GetGpuInstanceProfileInfo(p)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, nvmlErr(fmt.Sprintf("read GPU %s's GPU instance profile %d", d.UUID, p), ret)
		}
		out = append(out, giProfile{id: p, info: info})
	}
	return out, nil
}

func migDevice(d gpu.Device, parent, m nvml.Device, profiles []giProfile, caps *nvcaps.Reader) (gpu.MIGDevice, error) {
	md := gpu.MIGDevice{ParentUUID: d.UUID, Parent: d.Node}
	var ret nvml.Return
	if md.UUID, ret = m.GetUUID(); ret != nvml.SUCCESS {
		return md, nvmlErr(fmt.Sprintf("read the UUID of a MIG device on GPU %s", d.UUID), ret)
	}
	what := fmt.Sprintf("MIG device %s on GPU %s", md.UUID, d.UUID)
	if md.GPUInstance, ret = m.GetGpuInstanceId(); ret != nvml.SUCCESS {
		return md, nvmlErr("read the GPU instance of "+what, ret)
	}
	if md.ComputeInstance, ret = m.GetComputeInstanceId(); ret != nvml.SUCCESS {
		return md, nvmlErr("read the compute instance of "+what, ret)
	}
	what = fmt.Sprintf("%s (GI %d, CI %d)", what, md.GPUInstance, md.ComputeInstance)
	mem, ret := m.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return md, nvmlErr("read the memory of "+what, ret)
	}
	md.MemoryBytes = mem.Total
	gi, ret := parent.GetGpuInstanceById(md.GPUInstance)
	if ret != nvml.SUCCESS {
		return md, nvmlErr("open the GPU instance of "+what, ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return md, nvmlErr("read the GPU instance of "+what, ret)
	}
	ci, ret := gi.GetComputeInstanceById(md.ComputeInstance)
	if ret != nvml.SUCCESS {
		return md, nvmlErr("open the compute instance of "+what, ret)
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return md, nvmlErr("read the compute instance of "+what, ret)
	}
	gp, ok := findGIProfile(profiles, giInfo.ProfileId)
	if !ok {
		return md, fmt.Errorf("%s: its GPU instance has profile ID %d, which the GPU does not list among its profiles; check the driver with nvidia-smi mig -lgip -i %d", what, giInfo.ProfileId, d.Index)
	}
	cp, err := computeInstanceProfile(gi, ciInfo.ProfileId, what)
	if err != nil {
		return md, err
	}
	if md.Profile, err = MIGProfileName(gp.id, gp.info, cp, d.MemoryBytes); err != nil {
		return md, fmt.Errorf("%s: %w", what, err)
	}
	md.GPUSlices, md.ComputeSlices, md.Multiprocessors = int(gp.info.SliceCount), int(cp.SliceCount), int(cp.MultiprocessorCount)
	md.Placement = gpu.MIGPlacement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)}
	if md.GIAccess, err = caps.Node(nvcaps.GPUInstanceFile(d.Minor, md.GPUInstance)); err != nil {
		return md, fmt.Errorf("%s: %w", what, err)
	}
	if md.CIAccess, err = caps.Node(nvcaps.ComputeInstanceFile(d.Minor, md.GPUInstance, md.ComputeInstance)); err != nil {
		return md, fmt.Errorf("%s: %w", what, err)
	}
	return md, nil
}

func findGIProfile(profiles []giProfile, id uint32) (giProfile, bool) {
	for _, p := range profiles {
		if p.info.Id == id {
			return p, true
		}
	}
	return giProfile{}, false
}

// computeInstanceProfile finds the profile of a CI among its GI's, over
// every profile and engine sharing mode, as go-nvlib's GetProfile does.
func computeInstanceProfile(gi nvml.GpuInstance, id uint32, what string) (nvml.ComputeInstanceProfileInfo, error) {
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		for e := 0; e < nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT; e++ {
			info, ret := gi.GetComputeInstanceProfileInfo(p, e)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue
			}
			if ret != nvml.SUCCESS {
				return info, nvmlErr(fmt.Sprintf("read compute instance profile %d of %s", p, what), ret)
			}
			if info.Id == id {
				return info, nil
			}
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("%s: its compute instance has profile ID %d, which its GPU instance does not list; check the driver with nvidia-smi mig -lcip", what, id)
}

// MIGLayout is a fingerprint of the node's MIG layout: each GPU's UUID, its
// current MIG mode and its MIG devices' UUIDs with their GPU and compute
// instance profile IDs (a driver may hand a new instance the UUID of one
// destroyed before it). It costs a few NVML calls
// per GPU, against Discover's profiles, capability files and pairwise
// topology, so it can be read often; two equal fingerprints are one
// layout. A pending MIG mode (no reset yet) is not part of it.
func (i *Inventory) MIGLayout(ctx context.Context) (string, error) {
	count, ret := i.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("count GPUs", ret)
	}
	var b strings.Builder
	for idx := 0; idx < count; idx++ {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		h, ret := i.lib.DeviceGetHandleByIndex(idx)
		if ret != nvml.SUCCESS {
			return "", nvmlErr(fmt.Sprintf("open GPU %d", idx), ret)
		}
		uuid, ret := h.GetUUID()
		if ret != nvml.SUCCESS {
			return "", nvmlErr(fmt.Sprintf("read GPU %d's UUID", idx), ret)
		}
		b.WriteString(uuid)
		cur, _, ret := h.GetMigMode()
		if ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_ENABLE {
			b.WriteByte('\n')
			continue
		}
		b.WriteString(" mig")
		slots, ret := h.GetMaxMigDeviceCount()
		if ret != nvml.SUCCESS {
			return "", nvmlErr(fmt.Sprintf("count GPU %s's MIG devices", uuid), ret)
		}
		for j := 0; j < slots; j++ {
			m, ret := h.GetMigDeviceHandleByIndex(j)
			if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue
			}
			if ret != nvml.SUCCESS {
				return "", nvmlErr(fmt.Sprintf("open GPU %s's MIG device %d", uuid, j), ret)
			}
			id, err := migIdentity(h, m)
			if err != nil {
				return "", fmt.Errorf("GPU %s's MIG device %d: %w", uuid, j, err)
			}
			b.WriteString(" " + id)
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// migIdentity is a MIG device's UUID and its instances' profile IDs.
func migIdentity(parent, m nvml.Device) (string, error) {
	uuid, ret := m.GetUUID()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("read the UUID", ret)
	}
	giID, ret := m.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("read the GPU instance of "+uuid, ret)
	}
	ciID, ret := m.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("read the compute instance of "+uuid, ret)
	}
	gi, ret := parent.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return "", nvmlErr("open the GPU instance of "+uuid, ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("read the GPU instance of "+uuid, ret)
	}
	ci, ret := gi.GetComputeInstanceById(ciID)
	if ret != nvml.SUCCESS {
		return "", nvmlErr("open the compute instance of "+uuid, ret)
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return "", nvmlErr("read the compute instance of "+uuid, ret)
	}
	return fmt.Sprintf("%s/%d/%d", uuid, giInfo.ProfileId, ciInfo.ProfileId), nil
}
