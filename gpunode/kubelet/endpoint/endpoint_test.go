package endpoint

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
)

// TestEndpointThroughKubeletProtocol registers the endpoint with a test
// kubelet over the real v1beta1 gRPC API and plays kubelet's side.
func TestEndpointThroughKubeletProtocol(t *testing.T) {
	dir := kubelettest.Dir(t)
	k := kubelettest.Start(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Hold(ctx, dir, "nvidia.com/gpu", slog.New(slog.DiscardHandler)) }()
	shutdown := sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { _ = shutdown() })
	// kubelet's side uses its own context: the stream must end because the
	// endpoint stops, not because the caller gave up.
	kctx := context.Background()

	req := k.WaitRegister(t, 5*time.Second)
	if req.ResourceName != "nvidia.com/gpu" || req.Endpoint != Socket {
		t.Fatalf("registered %s at %s, want nvidia.com/gpu at %s", req.ResourceName, req.Endpoint, Socket)
	}
	c := kubelettest.Dial(t, dir, req.Endpoint)
	opts, err := c.GetDevicePluginOptions(kctx, &pluginapi.Empty{})
	if err != nil || opts.PreStartRequired {
		t.Fatalf("options %+v, %v: kubelet must not be asked to call PreStartContainer", opts, err)
	}
	stream, err := c.ListAndWatch(kctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || len(first.Devices) != 0 {
		t.Fatalf("first list %v, %v; want an empty list (capacity 0)", first, err)
	}
	_, err = c.Allocate(kctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu-0"}}}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "DeviceClass gpu.nvinject.io") || !strings.Contains(err.Error(), "asked for [gpu-0]") {
		t.Errorf("Allocate error %v, want FailedPrecondition naming the device and the DeviceClass", err)
	}

	// The stream stays open (kubelet reads a closed one as the plugin
	// gone) until the endpoint stops.
	next := make(chan error, 1)
	go func() {
		_, err := stream.Recv()
		next <- err
	}()
	select {
	case err := <-next:
		t.Fatalf("stream ended before shutdown: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := shutdown(); err != nil {
		t.Errorf("Run: %v", err)
	}
	select {
	case err := <-next:
		if !errors.Is(err, io.EOF) {
			t.Errorf("stream ended with %v, want the server's clean end (EOF)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stream still open 10 s after shutdown")
	}
	if _, err := os.Stat(filepath.Join(dir, Socket)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind after shutdown: %v", err)
	}
}
