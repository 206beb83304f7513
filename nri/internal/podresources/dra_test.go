package podresources

import (
	"context"
	"reflect"
	"testing"

	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// A pod holding two claims, one of nvinject's driver and one of another
// driver: only the first is reported, with only its driver's devices.
func TestClaims(t *testing.T) {
	res := func(driver, dev string, cdi ...string) *podresv1.ClaimResource {
		cr := &podresv1.ClaimResource{DriverName: driver, PoolName: "node", DeviceName: dev}
		for _, n := range cdi {
			cr.CdiDevices = append(cr.CdiDevices, &podresv1.CDIDevice{Name: n})
		}
		return cr
	}
	c := serve(t, lister{pods: []*podresv1.PodResources{{Name: "pod", Namespace: "ns", Containers: []*podresv1.ContainerResources{
		{Name: "side"},
		{Name: "main", DynamicResources: []*podresv1.DynamicResource{
			{ClaimName: "vllm-gpu", ClaimNamespace: "ns", ClaimResources: []*podresv1.ClaimResource{
				res("gpu.nvinject.io", "gpu-0", "nvidia.com/gpu=GPU-a"), res("nic.example.com", "eth1", "example.com/nic=eth1")}},
			{ClaimName: "nic", ClaimNamespace: "ns", ClaimResources: []*podresv1.ClaimResource{res("nic.example.com", "eth0", "example.com/nic=eth0")}},
		}},
	}}}})

	pods, err := c.List(context.Background(), "nvidia.com/gpu", "gpu.nvinject.io")
	if err != nil || len(pods) != 1 {
		t.Fatalf("List = %+v, %v", pods, err)
	}
	got := pods[0].Container("main").Claims
	want := []Claim{{Namespace: "ns", Name: "vllm-gpu", Devices: []ClaimDevice{{Pool: "node", Device: "gpu-0", CDIDevices: []string{"nvidia.com/gpu=GPU-a"}}}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("claims = %+v; want %+v", got, want)
	}
	if s := got[0].String(); s != "ResourceClaim ns/vllm-gpu" {
		t.Errorf("String = %q", s)
	}
	if got := pods[0].Container("side").Claims; len(got) != 0 {
		t.Errorf("container without claims: %+v", got)
	}
}
