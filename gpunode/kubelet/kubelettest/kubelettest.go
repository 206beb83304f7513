// Package kubelettest is a test kubelet whose device manager behaves as
// kubelet 1.37.2's does (pkg/kubelet/cm/devicemanager): the v1beta1
// Registration service on a real kubelet.sock; a Register dials the
// plugin's socket, asks its options and opens ListAndWatch; connections are
// keyed by socket path, and a second Register of a connected path is
// rejected with "device plugin already connected" and drops every client of
// that path while its endpoint entry stays, so the path is refused until
// the kubelet restarts. A stopped kubelet leaves its kubelet.sock behind; a
// starting one removes every socket in the directory before it listens.
// PodResources (podresources.go) is kubelet's PodResources List.
package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// AlreadyConnected is kubelet 1.37.2's rejection of a second Register for a
// connected socket path (devicemanager/manager.go PluginConnected).
const AlreadyConnected = "device plugin already connected"

// Kubelet is one running kubelet instance.
type Kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	Dir  string
	reqs chan *pluginapi.RegisterRequest
	srv  *grpc.Server

	mu sync.Mutex
	// clients per socket path, as the registration server keeps them.
	clients map[string][]*client
	// endpoints per socket path: the device manager's endpointStore.
	endpoints map[string]*client
	rejected  []string
	accepted  []string
	devices   map[string][]*pluginapi.Device
	streams   sync.WaitGroup
	stopped   bool
}

type client struct {
	path string
	conn *grpc.ClientConn
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

// Start starts a kubelet in dir: it removes every socket there (a stale
// kubelet.sock and plugins' sockets), then serves Registration on
// dir/kubelet.sock until the test ends.
func Start(t testing.TB, dir string) *Kubelet {
	t.Helper()
	Cleanup(t, dir)
	return Listen(t, dir)
}

// Cleanup removes every socket in dir, as a starting kubelet does.
func Cleanup(t testing.TB, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		}
	}
}

// Listen serves Registration on dir/kubelet.sock without cleaning dir
// first, for tests of the orderings a starting kubelet can race with.
// A stale kubelet.sock there is replaced.
func Listen(t testing.TB, dir string) *Kubelet {
	t.Helper()
	p := filepath.Join(dir, "kubelet.sock")
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	// Like kubelet, a stopped server leaves the socket file in place.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	k := &Kubelet{
		Dir: dir, reqs: make(chan *pluginapi.RegisterRequest, 64), srv: grpc.NewServer(),
		clients: map[string][]*client{}, endpoints: map[string]*client{}, devices: map[string][]*pluginapi.Device{},
	}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(ln) }()
	t.Cleanup(k.Stop)
	return k
}

// Register connects to the plugin as kubelet's device manager does.
func (k *Kubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	// Seen by WaitRegister once handled, as the plugin sees the answer.
	defer func() {
		select {
		case k.reqs <- r:
		default: // a plugin registering in a loop must not block the kubelet
		}
	}()
	path := filepath.Join(k.Dir, r.Endpoint)
	c := &client{path: path}
	k.mu.Lock()
	k.clients[path] = append(k.clients[path], c)
	k.mu.Unlock()
	if err := k.connect(ctx, c); err != nil {
		// kubelet removes every client of the path, the live one too,
		// without disconnecting it; the endpoint entry stays.
		k.mu.Lock()
		delete(k.clients, path)
		if errors.Is(err, errAlready) {
			k.rejected = append(k.rejected, r.Endpoint)
		}
		if c.conn != nil {
			_ = c.conn.Close()
		}
		k.mu.Unlock()
		return nil, err
	}
	k.mu.Lock()
	k.accepted = append(k.accepted, r.Endpoint)
	k.mu.Unlock()
	return &pluginapi.Empty{}, nil
}

var errAlready = errors.New(AlreadyConnected)

func (k *Kubelet) connect(ctx context.Context, c *client) error {
	conn, err := grpc.NewClient("unix://"+c.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	k.mu.Lock()
	c.conn = conn
	k.mu.Unlock()
	api := pluginapi.NewDevicePluginClient(conn)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := api.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true)); err != nil {
		return fmt.Errorf("failed to get device plugin options: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.endpoints[c.path]; ok {
		return fmt.Errorf("%w: %s", errAlready, c.path)
	}
	if k.stopped {
		return errors.New("kubelet stopping")
	}
	k.endpoints[c.path] = c
	k.streams.Add(1)
	go k.run(c, api)
	return nil
}

// run receives the plugin's device lists until the stream ends; then, as
// kubelet does, it disconnects the client only if it is still registered.
func (k *Kubelet) run(c *client, api pluginapi.DevicePluginClient) {
	defer k.streams.Done()
	stream, err := api.ListAndWatch(context.Background(), &pluginapi.Empty{})
	for err == nil {
		var resp *pluginapi.ListAndWatchResponse
		if resp, err = stream.Recv(); err != nil {
			break
		}
		k.mu.Lock()
		k.devices[c.path] = resp.Devices
		k.mu.Unlock()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, o := range k.clients[c.path] {
		if o == c {
			k.disconnectLocked(c)
			return
		}
	}
}

func (k *Kubelet) disconnectLocked(c *client) {
	if c.conn != nil {
		_ = c.conn.Close()
	}
	var keep []*client
	for _, o := range k.clients[c.path] {
		if o != c {
			keep = append(keep, o)
		}
	}
	if len(keep) == 0 {
		delete(k.clients, c.path)
	} else {
		k.clients[c.path] = keep
	}
	if k.endpoints[c.path] == c {
		delete(k.endpoints, c.path)
	}
}

// Stop ends this kubelet: its clients are disconnected and its server
// stopped; kubelet.sock stays behind, as a stopped kubelet leaves it.
func (k *Kubelet) Stop() {
	k.mu.Lock()
	k.stopped = true
	for _, cs := range k.clients {
		for _, c := range cs {
			k.disconnectLocked(c)
		}
	}
	k.mu.Unlock()
	k.srv.Stop()
	k.streams.Wait()
}

// Drop closes this kubelet's connection to the plugin at endpoint without
// a restart, as kubelet does when a plugin's ListAndWatch stream breaks.
func (k *Kubelet) Drop(endpoint string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	path := filepath.Join(k.Dir, endpoint)
	for _, c := range k.clients[path] {
		k.disconnectLocked(c)
	}
}

// Wedge leaves an endpoint entry for endpoint with no client, the state a
// rejected duplicate Register leaves behind: every later Register of that
// path is refused until the kubelet restarts.
func (k *Kubelet) Wedge(endpoint string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	path := filepath.Join(k.Dir, endpoint)
	k.endpoints[path] = &client{path: path}
}

// Restart stops this kubelet and starts a new one, as a kubelet restart does.
func (k *Kubelet) Restart(t testing.TB) *Kubelet {
	t.Helper()
	k.Stop()
	return Start(t, k.Dir)
}

// Accepted and Rejected are the endpoints whose Register this kubelet
// accepted, or rejected as already connected, in order.
func (k *Kubelet) Accepted() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.accepted...)
}

// Rejected: see Accepted.
func (k *Kubelet) Rejected() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.rejected...)
}

// Connected reports whether the kubelet has a live client for endpoint, as
// the device manager's endpoint for the resource.
func (k *Kubelet) Connected(endpoint string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	path := filepath.Join(k.Dir, endpoint)
	c, ok := k.endpoints[path]
	return ok && c.conn != nil && len(k.clients[path]) > 0
}

// Devices returns the last device list the plugin at endpoint sent.
func (k *Kubelet) Devices(endpoint string) []*pluginapi.Device {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.devices[filepath.Join(k.Dir, endpoint)]
}

// WaitRegister returns the next Register request once handled, failing
// after timeout.
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

// WaitConnected waits until the kubelet has a live client for endpoint.
func (k *Kubelet) WaitConnected(t testing.TB, endpoint string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !k.Connected(endpoint) {
		if time.Now().After(deadline) {
			t.Fatalf("kubelet not connected to %s within %s (accepted %v, rejected %v)", endpoint, timeout, k.Accepted(), k.Rejected())
		}
		time.Sleep(time.Millisecond)
	}
}

// Requests are the Register calls not yet taken by WaitRegister.
func (k *Kubelet) Requests() <-chan *pluginapi.RegisterRequest { return k.reqs }

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
