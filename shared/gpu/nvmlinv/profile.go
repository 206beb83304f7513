package nvmlinv

import (
	"errors"
	"fmt"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// profileSuffixes are the GPU instance profiles nvinject names, with the
// suffix NVIDIA gives each variant: "+me" for media extensions (the GPU's
// JPEG and OFA engines, which one instance at a time holds). The +gfx, -me
// and +me.all variants are left out until a simulated GPU models them.
var profileSuffixes = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE: "", nvml.GPU_INSTANCE_PROFILE_2_SLICE: "",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE: "", nvml.GPU_INSTANCE_PROFILE_4_SLICE: "",
	nvml.GPU_INSTANCE_PROFILE_6_SLICE: "", nvml.GPU_INSTANCE_PROFILE_7_SLICE: "",
	nvml.GPU_INSTANCE_PROFILE_8_SLICE: "", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: "",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "+me", nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1: "+me",
}

// ErrUnnamedProfile is returned for a GPU instance profile variant nvinject
// does not name.
var ErrUnnamedProfile = errors.New("GPU instance profile variant nvinject does not name")

// MIGProfileName is NVIDIA's name for a CI of profile ci in a GI of profile
// gi (asked for as NVML profile constant giProfile) on a GPU with totalBytes
// of memory: "<G>g.<GB>gb", "<C>c.<G>g.<GB>gb" when the CI has fewer slices
// than the GI, then the variant's suffix, as go-nvlib's MigProfile spells
// it. GB is the GI's memory in eighths of the GPU's, times the GPU's GiB.
func MIGProfileName(giProfile int, gi nvml.GpuInstanceProfileInfo, ci nvml.ComputeInstanceProfileInfo, totalBytes uint64) (string, error) {
	suffix, ok := profileSuffixes[giProfile]
	if !ok {
		return "", fmt.Errorf("%w (NVML profile %d): recreate the instance with a profile nvidia-smi mig -lgip lists without a +gfx, -me or +me.all suffix", ErrUnnamedProfile, giProfile)
	}
	if totalBytes == 0 {
		return "", fmt.Errorf("the GPU reports no memory, so its MIG profiles have no size; check it with nvidia-smi -q -d MEMORY")
	}
	const gib = 1 << 30
	gpuGB := (totalBytes + gib - 1) / gib
	gb := uint64(math.Round(float64(MIGMemoryEighths(uint64(gi.MemorySizeMB), totalBytes)*gpuGB) / 8))
	if ci.SliceCount == gi.SliceCount {
		return fmt.Sprintf("%dg.%dgb%s", gi.SliceCount, gb, suffix), nil
	}
	return fmt.Sprintf("%dc.%dg.%dgb%s", ci.SliceCount, gi.SliceCount, gb, suffix), nil
}

// MIGMemoryEighths is a GPU instance profile's memory (profileMiB) as a
// whole number of eighths of its GPU's, the unit MIG partitions memory in.
// go-nvlib rounds the share up; real profiles sit just under a whole
// eighth, where both agree, but go-nvml's H200 mock lists a 1g profile of
// 18 of 141 GiB, just over one, which rounding up would name 1g.35gb.
func MIGMemoryEighths(profileMiB, totalBytes uint64) uint64 {
	if totalBytes == 0 {
		return 0
	}
	return uint64(math.Round(float64(profileMiB<<20) * 8 / float64(totalBytes)))
}
