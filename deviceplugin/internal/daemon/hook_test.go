package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// With --hook-binary the plugin writes the same complete spec as
// nvinject-cdi generate --hook-binary: the library links, CUDA forward
// compatibility and the ld.so.cache update run from that program.
func TestSpecRunsTheHookBinary(t *testing.T) {
	hook := filepath.Join(t.TempDir(), "nvinject-cdi-hook")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := start(t, "sim:a100-80gb", "--hook-binary="+hook)
	spec, err := os.ReadFile(filepath.Join(r.dir, "cdi", "nvidia.com-gpu.yaml"))
	if err != nil {
		t.Fatalf("CDI spec not written before Register: %v", err)
	}
	for _, want := range []string{"path: " + hook, "- create-symlinks", "- libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so", "- enable-cuda-compat", "- update-ldcache"} {
		if !strings.Contains(string(spec), want) {
			t.Errorf("CDI spec lacks %q:\n%s", want, spec)
		}
	}
}
