// Package kubelettest is a test kubelet: the v1beta1 Registration service
// on a real kubelet.sock, a client dialing plugins as kubelet does, and
// the PodResources List service.
package kubelettest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Kubelet is one running registration server.
type Kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	Dir  string
	reqs chan *pluginapi.RegisterRequest
	srv  *grpc.Server
}

// Dir returns a fresh directory with a path short enough for unix sockets.
func Dir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "nvdp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

// Start serves Registration on dir/kubelet.sock until the test ends.
func Start(t testing.TB, dir string) *Kubelet {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &Kubelet{Dir: dir, reqs: make(chan *pluginapi.RegisterRequest, 16), srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(ln) }()
	t.Cleanup(k.srv.Stop)
	return k
}

// Register records the request, as kubelet's device manager accepts it.
func (k *Kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

// WaitRegister returns the next Register request, failing after timeout.
func (k *Kubelet) WaitRegister(t testing.TB, timeout time.Duration) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.reqs:
		return r
	case <-time.After(timeout):
		t.Fatalf("no Register call within %s", timeout)
		return nil
	}
}

// Requests are the Register calls not yet taken by WaitRegister.
func (k *Kubelet) Requests() <-chan *pluginapi.RegisterRequest { return k.reqs }

// Restart stops this kubelet, removes kubelet.sock and starts a new one,
// as a kubelet restart does.
func (k *Kubelet) Restart(t testing.TB) *Kubelet {
	t.Helper()
	k.srv.Stop()
	if err := os.Remove(filepath.Join(k.Dir, "kubelet.sock")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return Start(t, k.Dir)
}

// Dial connects to a plugin's endpoint (a file name in dir) as kubelet does.
func Dial(t testing.TB, dir, endpoint string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// PodResources is kubelet's PodResources List on a real unix socket.
type PodResources struct {
	podresv1.UnimplementedPodResourcesListerServer
	Socket string
	mu     sync.Mutex
	pods   []*podresv1.PodResources
	err    error
}

// StartPodResources serves List on socket until the test ends.
func StartPodResources(t testing.TB, socket string) *PodResources {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	p, srv := &PodResources{Socket: socket}, grpc.NewServer()
	podresv1.RegisterPodResourcesListerServer(srv, p)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return p
}

// List answers the pods last Set, or the error last Fail gave.
func (p *PodResources) List(context.Context, *podresv1.ListPodResourcesRequest) (*podresv1.ListPodResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, p.err
	}
	return &podresv1.ListPodResourcesResponse{PodResources: p.pods}, nil
}

// Set makes List answer pods.
func (p *PodResources) Set(pods ...*podresv1.PodResources) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods, p.err = pods, nil
}

// Fail makes List answer err until the next Set.
func (p *PodResources) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}
