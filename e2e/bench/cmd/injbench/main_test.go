package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInjbenchTwoContainers builds the command and what it runs, then
// measures two GPU containers per path on a real containerd.
func TestInjbenchTwoContainers(t *testing.T) {
	tools := os.Getenv("NVINJECT_TOOLS_BIN")
	if tools == "" {
		t.Skip("NVINJECT_TOOLS_BIN is unset: run `make tools` and set it to $(e2e/harness/tools/build.sh --print-bin)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: it runs containerd and runc")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/",
		"github.com/nvinject/nvinject/cdi/cmd/nvinject-cdi", "github.com/nvinject/nvinject/cdi/simulation/cmd/nvidia-smi-sim",
		"github.com/nvinject/nvinject/nri/cmd/nvinject-nri", "github.com/nvinject/nvinject/e2e/cmd/pause", ".")
	build.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	runDir := "/tmp/nvinject-injbench-test"
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(bin, "injbench"), "-n", "2", "-tools-bin", tools, "-run-dir", runDir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("injbench: %v\nstdout:\n%s\nstderr:\n%s", err, &stdout, &stderr)
	}
	t.Logf("\n%s", &stdout)

	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var got struct {
		A, B struct {
			N        int     `json:"n"`
			MedianMS float64 `json:"median_ms"`
		}
		Ratio float64 `json:"ratio_b_a_median"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("last line is not the JSON report: %v", err)
	}
	if got.A.N != 2 || got.B.N != 2 || got.A.MedianMS <= 0 || got.B.MedianMS <= 0 || got.Ratio <= 0 {
		t.Errorf("report = %+v, want 2 measured containers per path and a ratio", got)
	}
	entries, err := os.ReadDir(runDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "logs" {
			t.Errorf("teardown left %s in %s", e.Name(), runDir)
		}
	}
	_ = os.RemoveAll(runDir)
}
