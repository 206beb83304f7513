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

// lister is a kubelet serving List: pods, or err.
type lister struct {
	podresv1.UnimplementedPodResourcesListerServer
	pods []*podresv1.PodResources
	err  error
}

func (l lister) List(context.Context, *podresv1.ListPodResourcesRequest) (*podresv1.ListPodResourcesResponse, error) {
	return &podresv1.ListPodResourcesResponse{PodResources: l.pods}, l.err
}

func dev(r string, ids ...string) *podresv1.ContainerDevices {
	return &podresv1.ContainerDevices{ResourceName: r, DeviceIds: ids}
}

func TestList(t *testing.T) {
	c := serve(t, lister{pods: []*podresv1.PodResources{
		{Name: "other", Namespace: "ns", Containers: []*podresv1.ContainerResources{{Name: "main", Devices: []*podresv1.ContainerDevices{dev("nvidia.com/gpu", "GPU-x")}}}},
		{Name: "pod", Namespace: "ns", Containers: []*podresv1.ContainerResources{
			{Name: "side", Devices: []*podresv1.ContainerDevices{dev("nvidia.com/gpu", "GPU-y")}},
			{Name: "main", Devices: []*podresv1.ContainerDevices{dev("nvidia.com/gpu", "GPU-b", "GPU-a"), dev("example.com/nic", "n0"), dev("nvidia.com/mig-1g.10gb", "MIG-c")}},
			// A MIG resource of another domain is not the GPUs'.
			{Name: "mig", Devices: []*podresv1.ContainerDevices{dev("nvidia.com/mig-3g.40gb", "MIG-d"), dev("example.com/mig-1g.10gb", "MIG-e")}},
			{Name: "nic", Devices: []*podresv1.ContainerDevices{dev("example.com/nic", "n1")}},
		}},
		{Name: "web", Namespace: "ns", Containers: []*podresv1.ContainerResources{{Name: "main"}}},
	}})
	got, err := c.List(context.Background(), "nvidia.com/gpu", "gpu.nvinject.io")
	want := []Pod{
		{Namespace: "ns", Name: "other", Containers: []Container{{Name: "main", DeviceIDs: []string{"GPU-x"}}}},
		{Namespace: "ns", Name: "pod", Containers: []Container{{Name: "side", DeviceIDs: []string{"GPU-y"}}, {Name: "main", DeviceIDs: []string{"GPU-a", "GPU-b", "MIG-c"}},
			{Name: "mig", DeviceIDs: []string{"MIG-d"}}}},
		{Namespace: "ns", Name: "web"},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("List = %+v, %v; want %+v", got, err, want)
	}
	if ids := got[1].Container("main").DeviceIDs; !reflect.DeepEqual(ids, []string{"GPU-a", "GPU-b", "MIG-c"}) {
		t.Errorf("Container(main) = %v", ids)
	}
	if ctr := got[1].Container("nic"); ctr.DeviceIDs != nil || ctr.Claims != nil {
		t.Errorf("container with another resource only: %+v", ctr)
	}
}

func TestListFails(t *testing.T) {
	c := serve(t, lister{err: errors.New("kubelet is restarting")})
	if _, err := c.List(context.Background(), "nvidia.com/gpu", "gpu.nvinject.io"); err == nil || !strings.Contains(err.Error(), "kubelet is restarting") || !strings.Contains(err.Error(), "--pod-resources-socket") {
		t.Fatalf("err = %v, want kubelet's error and what to check", err)
	}
}

// serve runs kubelet's PodResources API backed by l on a real unix
// socket and returns a Client connected to it; both end with t.
func serve(t *testing.T, l podresv1.PodResourcesListerServer) *Client {
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
	podresv1.RegisterPodResourcesListerServer(srv, l)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	c, err := New(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
