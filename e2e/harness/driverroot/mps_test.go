package driverroot

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nvinject/nvinject/gpunode/mps"
)

// NVIDIA's real MPS control daemon, from the 535 packages, runs without a
// GPU under the node's manager: it listens in its pipe directory, takes the
// share's limits, answers a client as it answers an operator, and quits
// when the node stops.
func TestRealMPSControlDaemon(t *testing.T) {
	r := root(t, Flat)
	dir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	prog := mps.Program{Path: filepath.Join(r, "usr/bin", mps.ControlBinary), Env: []string{"LD_LIBRARY_PATH=" + filepath.Join(r, LibDir)}}
	m := mps.New(dir)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = m.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	m.Sync(prog, []mps.Daemon{{ID: "GPU-a", Visible: "GPU-a", ActiveThreadPercentage: 25, PinnedMemoryMiB: 20480}})
	deadline := time.Now().Add(30 * time.Second)
	for m.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("real MPS control daemon not ready: %v", m.Ready())
		}
		time.Sleep(50 * time.Millisecond)
	}
	pipe := mps.PathsOf(dir, "GPU-a").Pipe
	for cmd, want := range map[string]string{"get_default_active_thread_percentage": "25.0", "get_default_device_pinned_mem_limit 0": "20G"} {
		if got, err := prog.Command(ctx, pipe, cmd); err != nil || got != want {
			t.Errorf("%s: %q %v, want %q", cmd, got, err, want)
		}
	}
	cancel()
	wg.Wait()
	// The real daemon leaves its socket file behind; nobody listens on it.
	if c, err := net.Dial("unix", mps.PathsOf(dir, "GPU-a").Control()); err == nil {
		c.Close()
		t.Error("the control daemon still listens after the node stopped")
	}
}
