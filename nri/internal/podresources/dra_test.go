package podresources

import (
	"context"
	"reflect"
	"testing"

	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// draKubelet serves Get with a pod holding two claims: one of nvinject's
// driver, one of another driver.
type draKubelet struct {
	podresv1.UnimplementedPodResourcesListerServer
}

func (draKubelet) Get(_ context.Context, r *podresv1.GetPodResourcesRequest) (*podresv1.GetPodResourcesResponse, error) {
	if r.PodName != "pod" {
		return &podresv1.GetPodResourcesResponse{}, nil
	}
	res := func(driver, dev string, cdi ...string) *podresv1.ClaimResource {
		cr := &podresv1.ClaimResource{DriverName: driver, PoolName: "node", DeviceName: dev}
		for _, n := range cdi {
			cr.CdiDevices = append(cr.CdiDevices, &podresv1.CDIDevice{Name: n})
		}
		return cr
	}
	return &podresv1.GetPodResourcesResponse{PodResources: &podresv1.PodResources{Name: "pod", Namespace: "ns", Containers: []*podresv1.ContainerResources{
		{Name: "side"},
		{Name: "main", DynamicResources: []*podresv1.DynamicResource{
			{ClaimName: "vllm-gpu", ClaimNamespace: "ns", ClaimResources: []*podresv1.ClaimResource{res("gpu.nvinject.io", "gpu-0", "nvidia.com/gpu=GPU-a")}},
			{ClaimName: "nic", ClaimNamespace: "ns", ClaimResources: []*podresv1.ClaimResource{res("nic.example.com", "eth0", "example.com/nic=eth0")}},
		}},
	}}}, nil
}

func TestClaims(t *testing.T) {
	c := serve(t, draKubelet{})

	got, err := c.Claims(context.Background(), "ns", "pod", "main", "gpu.nvinject.io")
	want := []Claim{{Namespace: "ns", Name: "vllm-gpu", Devices: []ClaimDevice{{Pool: "node", Device: "gpu-0", CDIDevices: []string{"nvidia.com/gpu=GPU-a"}}}}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Claims = %+v, %v; want %+v", got, err, want)
	}
	if s := got[0].String(); s != "ResourceClaim ns/vllm-gpu" {
		t.Errorf("String = %q", s)
	}
	if got, err := c.Claims(context.Background(), "ns", "pod", "side", "gpu.nvinject.io"); err != nil || len(got) != 0 {
		t.Errorf("container without claims: %+v, %v", got, err)
	}
	if _, err := c.Claims(context.Background(), "ns", "missing", "main", "gpu.nvinject.io"); err == nil {
		t.Error("a pod kubelet does not know was accepted")
	}
}
