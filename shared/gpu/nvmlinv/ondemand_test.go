package nvmlinv

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/nvinject/nvinject/shared/gpu"
)

// refusingGPU is one MIG GPU behind go-nvml's mock whose GPU instance
// create, compute instance create and destroys answer as given; destroyed
// counts the GPU instance destroys that went through.
type refusingGPU struct {
	createGI, createCI, destroyCI, destroyGI nvml.Return
	destroyed                                int
}

func (r *refusingGPU) inventory(t *testing.T) (*Inventory, gpu.Device) {
	t.Helper()
	const uuid = "GPU-a"
	info := nvml.GpuInstanceProfileInfo{Id: 0, SliceCount: 1, MemorySizeMB: 10240}
	ci := &mock.ComputeInstance{DestroyFunc: func() nvml.Return { return r.destroyCI }}
	gi := &mock.GpuInstance{
		GetComputeInstanceProfileInfoFunc: func(p, _ int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
			if p != 0 {
				return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
			}
			return nvml.ComputeInstanceProfileInfo{SliceCount: 1}, nvml.SUCCESS
		},
		CreateComputeInstanceFunc: func(*nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
			return ci, r.createCI
		},
		GetComputeInstancesFunc: func(*nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
			return []nvml.ComputeInstance{ci}, nvml.SUCCESS
		},
		GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
			return nvml.GpuInstanceInfo{Id: 1, Placement: nvml.GpuInstancePlacement{Start: 0, Size: 1}}, nvml.SUCCESS
		},
		DestroyFunc: func() nvml.Return {
			if r.destroyGI == nvml.SUCCESS {
				r.destroyed++
			}
			return r.destroyGI
		},
	}
	dev := &mock.Device{
		GetUUIDFunc:                   func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetGpuInstanceProfileInfoFunc: func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) { return info, nvml.SUCCESS },
		CreateGpuInstanceWithPlacementFunc: func(*nvml.GpuInstanceProfileInfo, *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
			return gi, r.createGI
		},
		GetGpuInstancesFunc: func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
			return []nvml.GpuInstance{gi}, nvml.SUCCESS
		},
	}
	lib := &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
	}
	inv, err := New(lib)
	if err != nil {
		t.Fatal(err)
	}
	return inv, gpu.Device{UUID: uuid}
}

// A driver refusing MIG changes (NVML's Insufficient Permissions: no MIG
// config capability, as in an unprivileged container) is ErrMIGConfigDenied
// with the fix; other failures are not; a refused compute instance
// destroys the GPU instance made for it.
func TestMIGChangeDenied(t *testing.T) {
	slot := gpu.MIGSlot{Profile: "1g.10gb", GIProfile: 0, Placement: gpu.MIGPlacement{Start: 0, Size: 1}}
	ok := nvml.SUCCESS
	for _, tc := range []struct {
		name          string
		gpu           refusingGPU
		destroy       bool // DestroyMIG rather than CreateMIG
		denied        bool
		wantDestroyed int
	}{
		{name: "GPU instance create", gpu: refusingGPU{createGI: nvml.ERROR_NO_PERMISSION}, denied: true},
		{name: "compute instance create", gpu: refusingGPU{createGI: ok, createCI: nvml.ERROR_NO_PERMISSION, destroyCI: ok, destroyGI: ok}, denied: true, wantDestroyed: 1},
		{name: "compute instance destroy", gpu: refusingGPU{destroyCI: nvml.ERROR_NO_PERMISSION}, destroy: true, denied: true},
		{name: "GPU instance destroy", gpu: refusingGPU{destroyCI: ok, destroyGI: nvml.ERROR_NO_PERMISSION}, destroy: true, denied: true},
		{name: "other create failure", gpu: refusingGPU{createGI: nvml.ERROR_UNKNOWN}},
		{name: "other destroy failure", gpu: refusingGPU{destroyCI: ok, destroyGI: nvml.ERROR_IN_USE}, destroy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.gpu
			inv, d := r.inventory(t)
			var err error
			if tc.destroy {
				err = inv.DestroyMIG(d, slot)
			} else {
				_, err = inv.CreateMIG(d, slot)
			}
			if err == nil {
				t.Fatal("no error")
			}
			if got := errors.Is(err, ErrMIGConfigDenied); got != tc.denied {
				t.Errorf("errors.Is(%v, ErrMIGConfigDenied) = %v, want %v", err, got, tc.denied)
			}
			if fix := strings.Contains(err.Error(), "deploy/components/dra-mig-on-demand"); fix != tc.denied {
				t.Errorf("error %q names the privileged component: %v, want %v", err, fix, tc.denied)
			}
			if r.destroyed != tc.wantDestroyed {
				t.Errorf("%d GPU instances destroyed, want %d", r.destroyed, tc.wantDestroyed)
			}
		})
	}
}
