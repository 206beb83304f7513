package gpunode

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/cdi/simulation/simtest"
)

// A driver upgrade under a serving node: the root's links move to another
// version, the node says why on /readyz, removes the stale spec and ends
// with ErrDriverChanged, for the DaemonSet to restart it.
func TestDriverChangeRemovesTheStaleSpecAndEnds(t *testing.T) {
	dir := t.TempDir()
	simtest.DriverRoot(t, "sim:a100-80gb*2,driver=535.261.03", dir)
	root := filepath.Join(dir, "driver-root")
	cfg := config(t, "--nvml=sim:a100-80gb*2", "--driver-root="+root, "--driver-check-interval=10ms")
	n := New(cfg, quietLog())
	served := make(chan GPUs, 1)
	result := run(t, n, func(ctx context.Context, g GPUs) error {
		served <- g
		<-ctx.Done()
		return nil
	})
	var g GPUs
	select {
	case g = <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the protocol never started")
	}
	if g.Node.DriverVersion != "535.261.03" {
		t.Fatalf("served driver %s; want the root's 535.261.03", g.Node.DriverVersion)
	}
	specFile := filepath.Join(cfg.CDISpecDir, "nvidia.com-gpu.yaml")
	if _, err := os.Stat(specFile); err != nil {
		t.Fatal(err)
	}
	// Quiet while the root holds the served driver.
	time.Sleep(50 * time.Millisecond)
	if err := n.Ready(); err != nil {
		t.Fatalf("not ready before the upgrade: %v", err)
	}
	simtest.DriverRoot(t, "sim:a100-80gb*2,driver=550.163.01", dir)
	select {
	case err := <-result:
		if !errors.Is(err, ErrDriverChanged) || !strings.Contains(err.Error(), "535.261.03 to 550.163.01") {
			t.Errorf("Run ended with %v; want ErrDriverChanged naming both versions", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the node kept serving a stale spec after the driver changed")
	}
	if err := n.Ready(); err == nil || !strings.Contains(err.Error(), "550.163.01") || !strings.Contains(err.Error(), "stale") {
		t.Errorf("readiness after the change: %v; want it to name the new driver and the stale spec", err)
	}
	if _, err := os.Stat(specFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale spec is still served: stat %v", err)
	}
}

// 0 turns the check off: the spec stays and the node serves on.
func TestDriverCheckOff(t *testing.T) {
	dir := t.TempDir()
	simtest.DriverRoot(t, "sim:a100-80gb*2,driver=535.261.03", dir)
	cfg := config(t, "--nvml=sim:a100-80gb*2", "--driver-root="+filepath.Join(dir, "driver-root"), "--driver-check-interval=0")
	served := make(chan struct{})
	result := run(t, New(cfg, quietLog()), func(ctx context.Context, g GPUs) error {
		close(served)
		<-ctx.Done()
		return nil
	})
	<-served
	simtest.DriverRoot(t, "sim:a100-80gb*2,driver=550.163.01", dir)
	select {
	case err := <-result:
		t.Fatalf("Run ended with %v; want it serving with the check off", err)
	case <-time.After(200 * time.Millisecond):
	}
}
