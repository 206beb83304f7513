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

	"github.com/nvinject/nvinject/deviceplugin/internal/kubelettest"
)

type svc struct {
	pluginapi.UnimplementedDevicePluginServer
}

func TestRegistersWhenKubeletAppearsAfterFailures(t *testing.T) {
	dir := kubelettest.Dir(t)
	// A stale kubelet.sock nobody serves: Register fails and is retried.
	if err := os.WriteFile(filepath.Join(dir, "kubelet.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	results := make(chan error, 64)
	r := New(dir, "p.sock", "nvidia.com/gpu", svc{}, WithPoll(5*time.Millisecond), WithBackoff(time.Millisecond, 4*time.Millisecond),
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
