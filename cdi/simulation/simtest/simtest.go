//go:build !nosim

// Package simtest gives tests a SIMULATED node: its facts, discovered through
// the real NVML code path, and a simulated driver root on disk.
package simtest

import (
	"context"
	"os"
	"path/filepath"
	"sync"
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

// Roots keeps one simulated driver root per node shape for one test
// binary: writing a driver root is the slow part of a daemon's test.
type Roots struct {
	mu   sync.Mutex
	dirs map[string]string
}

// Get returns the driver root of the simulated node value, writing it on
// first use.
func (r *Roots) Get(t testing.TB, value string) string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.dirs[value]; ok {
		return filepath.Join(d, "driver-root")
	}
	dir, err := os.MkdirTemp("", "simroot")
	if err != nil {
		t.Fatal(err)
	}
	DriverRoot(t, value, dir)
	if r.dirs == nil {
		r.dirs = map[string]string{}
	}
	r.dirs[value] = dir
	return filepath.Join(dir, "driver-root")
}

// Run runs the tests, then deletes the driver roots; TestMain calls it:
// os.Exit(roots.Run(m)).
func (r *Roots) Run(m *testing.M) int {
	code := m.Run()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.dirs {
		_ = os.RemoveAll(d)
	}
	r.dirs = nil
	return code
}
