// Package simtest gives tests a SIMULATED node: its facts, discovered through
// the real NVML code path, and a simulated driver root on disk.
package simtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/nvinject/nvinject/cdi/simulation/simroot"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// DriverRoot discovers the simulated node value (e.g. "sim:a100-80gb*8")
// and writes its driver root into dir, with a stand-in nvidia-smi script.
func DriverRoot(t testing.TB, value, dir string) gpu.Node {
	t.Helper()
	b, err := backend.Open(value, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	node, err := b.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(dir, "nvidia-smi-sim")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(smi, []byte("#!/bin/sh\necho simulated\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := simroot.Write(filepath.Join(dir, "driver-root"), node, smi); err != nil {
		t.Fatal(err)
	}
	return node
}
