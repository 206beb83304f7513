package podresources

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// listOnly is a kubelet without the Get call (KubeletPodResourcesGet off).
type listOnly struct {
	podresv1.UnimplementedPodResourcesListerServer
}

func (listOnly) List(context.Context, *podresv1.ListPodResourcesRequest) (*podresv1.ListPodResourcesResponse, error) {
	dev := func(r string, ids ...string) *podresv1.ContainerDevices {
		return &podresv1.ContainerDevices{ResourceName: r, DeviceIds: ids}
	}
	return &podresv1.ListPodResourcesResponse{PodResources: []*podresv1.PodResources{
		{Name: "other", Namespace: "ns", Containers: []*podresv1.ContainerResources{{Name: "main", Devices: []*podresv1.ContainerDevices{dev("nvidia.com/gpu", "GPU-x")}}}},
		{Name: "pod", Namespace: "ns", Containers: []*podresv1.ContainerResources{
			{Name: "side", Devices: []*podresv1.ContainerDevices{dev("nvidia.com/gpu", "GPU-y")}},
			{Name: "main", Devices: []*podresv1.ContainerDevices{dev("nvidia.com/gpu", "GPU-b", "GPU-a"), dev("example.com/nic", "n0")}},
		}},
	}}, nil
}

func TestFallsBackToList(t *testing.T) {
	c := serve(t, listOnly{})
	got, err := c.DeviceIDs(context.Background(), "ns", "pod", "main", "nvidia.com/gpu")
	if err != nil || !slices.Equal(got, []string{"GPU-a", "GPU-b"}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := c.DeviceIDs(context.Background(), "ns", "missing", "main", "nvidia.com/gpu"); err == nil {
		t.Fatal("a pod kubelet does not know was accepted")
	}
}

// serve runs kubelet's PodResources API backed by lister on a real unix
// socket and returns a Client connected to it; both end with t.
func serve(t *testing.T, lister podresv1.PodResourcesListerServer) *Client {
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
	podresv1.RegisterPodResourcesListerServer(srv, lister)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	c, err := New(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
