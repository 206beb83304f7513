package podresources

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubelet serves List and GetAllocatableResources: pods and devices, or err.
type kubelet struct {
	podresv1.UnimplementedPodResourcesListerServer
	pods        []*podresv1.PodResources
	allocatable []*podresv1.ContainerDevices
	err         error
}

func (k kubelet) List(context.Context, *podresv1.ListPodResourcesRequest) (*podresv1.ListPodResourcesResponse, error) {
	return &podresv1.ListPodResourcesResponse{PodResources: k.pods}, k.err
}

func (k kubelet) GetAllocatableResources(context.Context, *podresv1.AllocatableResourcesRequest) (*podresv1.AllocatableResourcesResponse, error) {
	return &podresv1.AllocatableResourcesResponse{Devices: k.allocatable}, k.err
}

func dev(r string, ids ...string) *podresv1.ContainerDevices {
	return &podresv1.ContainerDevices{ResourceName: r, DeviceIds: ids}
}

func res(driver, device string, cdi ...string) *podresv1.ClaimResource {
	cr := &podresv1.ClaimResource{DriverName: driver, PoolName: "node", DeviceName: device}
	for _, n := range cdi {
		cr.CdiDevices = append(cr.CdiDevices, &podresv1.CDIDevice{Name: n})
	}
	return cr
}

// Each container's devices by resource (IDs sorted) and its claims with
// every driver's devices; containers assigned nothing are left out, pods
// are not.
func TestList(t *testing.T) {
	c := serve(t, kubelet{pods: []*podresv1.PodResources{
		{Name: "pod", Namespace: "ns", Containers: []*podresv1.ContainerResources{
			{Name: "main", Devices: []*podresv1.ContainerDevices{dev("nvidia.com/mig-1g.10gb", "MIG-c"), dev("nvidia.com/gpu", "GPU-b", "GPU-a"), dev("example.com/nic")},
				DynamicResources: []*podresv1.DynamicResource{{ClaimName: "vllm-gpu", ClaimNamespace: "ns", ClaimResources: []*podresv1.ClaimResource{
					res("gpu.nvinject.io", "gpu-0", "nvidia.com/gpu=GPU-a"), res("nic.example.com", "eth1", "example.com/nic=eth1")}}}},
			{Name: "idle"},
		}},
		{Name: "web", Namespace: "ns", Containers: []*podresv1.ContainerResources{{Name: "main"}}},
	}})
	got, err := c.List(context.Background())
	want := []Pod{
		{Namespace: "ns", Name: "pod", Containers: []Container{{Name: "main",
			Devices: []Devices{{Resource: "nvidia.com/gpu", IDs: []string{"GPU-a", "GPU-b"}}, {Resource: "nvidia.com/mig-1g.10gb", IDs: []string{"MIG-c"}}},
			Claims: []Claim{{Namespace: "ns", Name: "vllm-gpu", Devices: []ClaimDevice{
				{Driver: "gpu.nvinject.io", Pool: "node", Device: "gpu-0", CDIDevices: []string{"nvidia.com/gpu=GPU-a"}},
				{Driver: "nic.example.com", Pool: "node", Device: "eth1", CDIDevices: []string{"example.com/nic=eth1"}}}}}}}},
		{Namespace: "ns", Name: "web"},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("List = %+v, %v\nwant %+v", got, err, want)
	}
	main := got[0].Container("main")
	if ids := main.IDs(func(r string) bool { return strings.HasPrefix(r, "nvidia.com/") }); !reflect.DeepEqual(ids, []string{"GPU-a", "GPU-b", "MIG-c"}) {
		t.Errorf("IDs of nvidia.com resources = %v", ids)
	}
	mine := main.ClaimsOf("gpu.nvinject.io")
	if len(mine) != 1 || len(mine[0].Devices) != 1 || !reflect.DeepEqual(mine[0].CDIDevices(), []string{"nvidia.com/gpu=GPU-a"}) || mine[0].String() != "ResourceClaim ns/vllm-gpu" {
		t.Errorf("ClaimsOf(gpu.nvinject.io) = %+v; want the claim with its one device of that driver", mine)
	}
	if other := main.ClaimsOf("other.example.com"); other != nil {
		t.Errorf("ClaimsOf a driver with no device = %+v", other)
	}
	if ctr := got[0].Container("idle"); ctr.Devices != nil || ctr.Claims != nil {
		t.Errorf("a container assigned nothing: %+v", ctr)
	}
}

func TestAllocatable(t *testing.T) {
	c := serve(t, kubelet{allocatable: []*podresv1.ContainerDevices{dev("nvidia.com/gpu", "GPU-b", "GPU-a")}})
	got, err := c.Allocatable(context.Background())
	if err != nil || !reflect.DeepEqual(got, []Devices{{Resource: "nvidia.com/gpu", IDs: []string{"GPU-a", "GPU-b"}}}) {
		t.Fatalf("Allocatable = %+v, %v", got, err)
	}
}

// kubelet's error comes back with the socket and what to check.
func TestFailures(t *testing.T) {
	c := serve(t, kubelet{err: errors.New("kubelet is restarting")})
	if _, err := c.List(context.Background()); err == nil || !strings.Contains(err.Error(), "kubelet is restarting") ||
		!strings.Contains(err.Error(), "--pod-resources-socket") || !strings.Contains(err.Error(), c.Socket()) {
		t.Errorf("List: %v; want kubelet's error, the socket and what to check", err)
	}
	if _, err := c.Allocatable(context.Background()); err == nil || !strings.Contains(err.Error(), "kubelet is restarting") {
		t.Errorf("Allocatable: %v", err)
	}
	gone, err := Dial(filepath.Join(t.TempDir(), "no-kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if _, err := gone.List(context.Background()); err == nil {
		t.Error("List with no kubelet: want an error")
	}
}

// serve runs kubelet's PodResources API backed by k on a real unix socket
// and returns a Client dialled to it; both end with t.
func serve(t *testing.T, k podresv1.PodResourcesListerServer) *Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "podres")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "kubelet.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresv1.RegisterPodResourcesListerServer(srv, k)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	c, err := Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
