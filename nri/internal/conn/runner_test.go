package conn_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/conn"
	"github.com/nvinject/nvinject/nri/internal/nritest"
)

// plugin is the least a Runner registers: it adjusts nothing and accepts
// every validation.
type plugin struct{}

func (plugin) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}
func (plugin) ValidateContainerAdjustment(context.Context, *api.ValidateContainerAdjustmentRequest) error {
	return nil
}
func (plugin) Wait() {}

// run starts a runtime and a Runner registered with it.
func run(t *testing.T, opts ...conn.Option) (*nritest.Runtime, *conn.Runner) {
	t.Helper()
	// Unix socket paths must stay under ~100 bytes; t.TempDir() can exceed it.
	dir, err := os.MkdirTemp("", "nvconn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rt := nritest.NewRuntime(filepath.Join(dir, "nri.sock"), nil, nil)
	rt.Start(t)
	r := conn.New(plugin{}, "nvinject", "10", rt.Socket, append([]conn.Option{conn.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := r.Run(ctx); err != nil {
			t.Errorf("runner: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	rt.WaitSynced(t)
	waitFor(t, func() bool { return r.Ready() == nil })
	return rt, r
}

// TestReconnect: Reconnect drops the connection, stays away for the time
// asked and registers again; a second one before that is an error.
func TestReconnect(t *testing.T) {
	_, r := run(t)
	const away = 300 * time.Millisecond
	t0 := time.Now()
	if err := r.Reconnect(away); err != nil {
		t.Fatal(err)
	}
	if err := r.Reconnect(away); err == nil {
		t.Error("a second Reconnect while one is pending was accepted")
	}
	waitFor(t, func() bool { return r.Ready() != nil })
	if err := r.Reconnect(away); err == nil {
		t.Error("Reconnect while not connected was accepted")
	}
	waitFor(t, func() bool { return r.Ready() == nil })
	if took := time.Since(t0); took < away {
		t.Errorf("registered again %s after the drop; want at least %s away", took, away)
	}
}

// TestReconnectsWhenTheSocketReappears: after a long outage the backoff
// alone would next try seconds later (1ms doubling up to the retry
// interval); the watch on the socket's directory reconnects at once.
func TestReconnectsWhenTheSocketReappears(t *testing.T) {
	if testing.Short() {
		t.Skip("keeps the runtime down for 5s")
	}
	rt, r := run(t, conn.WithRetryInterval(time.Minute))
	rt.Stop()
	waitFor(t, func() bool { return r.Ready() != nil })
	// Attempts so far at about 1, 3, 7, ... 4095ms; the next at 8191ms.
	time.Sleep(5 * time.Second)
	t0 := time.Now()
	rt.Start(t)
	rt.WaitSynced(t)
	waitFor(t, func() bool { return r.Ready() == nil })
	if took := time.Since(t0); took > time.Second {
		t.Errorf("reconnected %s after the runtime came back; the socket watch should make it immediate", took)
	} else {
		t.Logf("reconnected %s after the runtime came back", took.Round(time.Millisecond))
	}
}

// TestReconnectsWhenTheSocketDirectoryComesBack: while the socket's
// directory is gone it is listed, so its return is seen, and the socket in
// it reconnects the plugin at once, as in the test above, not at the
// backoff's next attempt.
func TestReconnectsWhenTheSocketDirectoryComesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("keeps the runtime down for 1s")
	}
	rt, r := run(t, conn.WithRetryInterval(time.Minute))
	rt.Stop()
	waitFor(t, func() bool { return r.Ready() != nil })
	dir := filepath.Dir(rt.Socket)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	// Attempts so far at about 1, 3, 7, ... 1023ms; the next at 2047ms.
	time.Sleep(1100 * time.Millisecond)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	rt.Start(t)
	rt.WaitSynced(t)
	waitFor(t, func() bool { return r.Ready() == nil })
	if took := time.Since(t0); took > 500*time.Millisecond {
		t.Errorf("reconnected %s after the socket's directory and the runtime came back; listing the absent directory should make it immediate", took)
	} else {
		t.Logf("reconnected %s after the runtime came back", took.Round(time.Millisecond))
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
