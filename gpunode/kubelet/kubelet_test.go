package kubelet

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
)

// svc is the least a plugin serves for kubelet to connect: its options
// and a ListAndWatch stream that stays open.
type svc struct {
	pluginapi.UnimplementedDevicePluginServer
	// stop, when set, ends the streams (the registrar's WithStopService).
	stop chan struct{}
}

func (svc) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (v svc) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: "GPU-0", Health: pluginapi.Healthy}}}); err != nil {
		return err
	}
	select {
	case <-s.Context().Done():
	case <-v.stop:
	}
	return nil
}

func TestRegistersWhenKubeletAppearsAfterFailures(t *testing.T) {
	dir := kubelettest.Dir(t)
	// A stale kubelet.sock nobody serves: Register fails and is retried.
	if err := os.WriteFile(filepath.Join(dir, "kubelet.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	results := make(chan error, 64)
	stop := make(chan struct{})
	r := New(dir, "p.sock", "nvidia.com/gpu", svc{stop: stop}, WithStopService(func() { close(stop) }), WithPoll(5*time.Millisecond), WithBackoff(time.Millisecond, 4*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithOnRegister(func(err error) { results <- err }))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	if err := <-results; err == nil {
		t.Fatal("Register to a dead kubelet.sock succeeded")
	}
	if err := <-results; err == nil {
		t.Fatal("second attempt should also fail")
	}
	if err := os.Remove(filepath.Join(dir, "kubelet.sock")); err != nil {
		t.Fatal(err)
	}
	k := kubelettest.Start(t, dir)
	req := k.WaitRegister(t, 2*time.Second)
	for err := range results {
		if err == nil {
			break
		}
	}
	if req.Endpoint != "p.sock" || !r.Registered() {
		t.Fatalf("request %v, registered %v", req, r.Registered())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "p.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket left after stop: %v", err)
	}
}
