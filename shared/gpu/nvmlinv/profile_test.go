package nvmlinv

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestMIGProfileName(t *testing.T) {
	const mib = 1 << 20
	gi := func(slices, memMiB uint32) nvml.GpuInstanceProfileInfo {
		return nvml.GpuInstanceProfileInfo{SliceCount: slices, MemorySizeMB: uint64(memMiB)}
	}
	ci := func(slices uint32) nvml.ComputeInstanceProfileInfo {
		return nvml.ComputeInstanceProfileInfo{SliceCount: slices}
	}
	for _, tc := range []struct {
		profile int
		gi      nvml.GpuInstanceProfileInfo
		ci      nvml.ComputeInstanceProfileInfo
		total   uint64
		want    string
	}{
		// go-nvml's A100-SXM4-80GB mock (81920 MiB).
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, gi(1, 9856), ci(1), 81920 * mib, "1g.10gb"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, gi(1, 9856), ci(1), 81920 * mib, "1g.10gb+me"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, gi(1, 19968), ci(1), 81920 * mib, "1g.20gb"},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, gi(3, 40192), ci(3), 81920 * mib, "3g.40gb"},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, gi(3, 40192), ci(1), 81920 * mib, "1c.3g.40gb"},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, gi(7, 80384), ci(7), 81920 * mib, "7g.80gb"},
		// An H100 80GB HBM3 reports 81559 MiB in all: the same shares, the same names.
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, gi(1, 9856), ci(1), 81559 * mib, "1g.10gb"},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, gi(7, 80384), ci(7), 81559 * mib, "7g.80gb"},
		// go-nvml's H200 mock: 141 GiB, profiles a little over their eighths.
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, gi(1, 18432), ci(1), 144384 * mib, "1g.18gb"},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE, gi(2, 35840), ci(2), 144384 * mib, "2g.35gb"},
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, gi(3, 72704), ci(3), 144384 * mib, "3g.71gb"},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, gi(7, 144384), ci(7), 144384 * mib, "7g.141gb"},
		// A 24 GiB GPU split in quarters, as an A30 is: a quarter is two eighths.
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, gi(1, 5836), ci(1), 24576 * mib, "1g.6gb"},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE, gi(4, 23344), ci(4), 24576 * mib, "4g.24gb"},
	} {
		got, err := MIGProfileName(tc.profile, tc.gi, tc.ci, tc.total)
		if err != nil || got != tc.want {
			t.Errorf("profile %d, %d MiB of %d MiB: %q, %v; want %q", tc.profile, tc.gi.MemorySizeMB, tc.total/mib, got, err, tc.want)
		}
	}
	if _, err := MIGProfileName(nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, gi(1, 9856), ci(1), 81920*mib); !errors.Is(err, ErrUnnamedProfile) || !strings.Contains(err.Error(), "nvidia-smi mig -lgip") {
		t.Errorf("a +gfx profile: %v", err)
	}
	if _, err := MIGProfileName(nvml.GPU_INSTANCE_PROFILE_1_SLICE, gi(1, 9856), ci(1), 0); err == nil {
		t.Error("a GPU without memory: no error")
	}
}
