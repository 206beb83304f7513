// Package kubelettest is a test kubelet: the v1beta1 Registration service
// on a real kubelet.sock, and a client dialing plugins as kubelet does.
package kubelettest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
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
