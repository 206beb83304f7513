package driver_test

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// firstAvailable asks for a whole GPU, else two 1g.10gb MIG devices
// (KEP-4816, GA in 1.37).
func firstAvailable() resourceapi.DeviceRequest {
	sub := func(name, cel string, count int64) resourceapi.DeviceSubRequest {
		return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: contract.DRADriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}}
	}
	return resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		sub("whole", `device.attributes["gpu.nvinject.io"].type == "gpu"`, 1),
		sub("slices", `device.attributes["gpu.nvinject.io"].type == "mig" && device.attributes["gpu.nvinject.io"].profile == "1g.10gb"`, 2),
	}}
}

// Kubernetes 1.37's allocator gives the first claim the first alternative
// (the whole GPU 0) and the next the second (GPU 1's two 1g.10gb MIG
// devices), each result named request/subrequest; prepare answers each with
// its devices' CDI names under that name (kubeletplugin strips the
// subrequest for kubelet); a third claim fits no alternative.
func TestPrioritizedListAlternatives(t *testing.T) {
	d, _, sel := newSimDriver(t, migLayout, t.TempDir())
	s := newScheduler(t, d.Resources())
	first, second := unallocated("uid-1", "first", firstAvailable()), unallocated("uid-2", "second", firstAvailable())
	if !s.allocate(first) || !s.allocate(second) {
		t.Fatal("the alternatives were not allocated")
	}
	if s.allocate(unallocated("uid-3", "third", firstAvailable())) {
		t.Error("a third claim was allocated on a node with neither alternative left")
	}
	var mig []string
	for _, m := range sel[1].MIG {
		if m.Profile == "1g.10gb" {
			mig = append(mig, cdiName(m.UUID))
		}
	}
	for _, tc := range []struct {
		c       *resourceapi.ResourceClaim
		request string
		cdi     []string
	}{
		{first, "gpu/whole", []string{cdiName(sel[0].UUID)}},
		{second, "gpu/slices", mig},
	} {
		res := prepare(t, d, tc.c)
		if res.Err != nil {
			t.Fatalf("%s: %v", tc.c.Name, res.Err)
		}
		var cdi []string
		for _, dev := range res.Devices {
			if !slices.Equal(dev.Requests, []string{tc.request}) {
				t.Errorf("%s: device %s for requests %v, want %s", tc.c.Name, dev.DeviceName, dev.Requests, tc.request)
			}
			cdi = append(cdi, dev.CDIDeviceIDs...)
		}
		slices.Sort(cdi)
		slices.Sort(tc.cdi)
		if !slices.Equal(cdi, tc.cdi) {
			t.Errorf("%s: CDI names %v, want %v", tc.c.Name, cdi, tc.cdi)
		}
	}
}
