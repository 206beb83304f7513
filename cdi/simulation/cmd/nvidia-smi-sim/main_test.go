package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nvinject/nvinject/cdi/simulation/simfacts"
)

func setup(t *testing.T, minors ...int) (facts, dev string) {
	t.Helper()
	dir := t.TempDir()
	dev = filepath.Join(dir, "dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	f := simfacts.Facts{Simulated: simfacts.Notice, DriverVersion: "580.95.05", CUDAVersion: "13.0", GPUs: []simfacts.GPU{
		{Index: 0, Minor: 0, UUID: "GPU-aaaa", Name: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, PCIBusID: ":07:00.0"},
		{Index: 1, Minor: 1, UUID: "GPU-bbbb", Name: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, PCIBusID: ":0f:00.0"},
	}}
	data, _ := json.Marshal(f)
	facts = filepath.Join(dir, "facts.json")
	if err := os.WriteFile(facts, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, m := range minors {
		if err := syscall.Mknod(filepath.Join(dev, "nvidia"+string(rune('0'+m))), syscall.S_IFCHR|0o666, 195<<8|m); err != nil {
			t.Skipf("cannot create device nodes here (needs root): %v", err)
		}
	}
	return facts, dev
}

func TestReportsOnlyVisibleGPUs(t *testing.T) {
	facts, dev := setup(t, 1)
	var out, errb bytes.Buffer
	code := run([]string{"--query-gpu=uuid,name,memory.total", "--format=csv,noheader"}, &out, &errb, facts, dev)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if got := strings.TrimSpace(out.String()); got != "GPU-bbbb, NVIDIA A100-SXM4-80GB, 81920 MiB" {
		t.Fatalf("output %q", got)
	}
}

func TestWrongNodeIsNotAGPU(t *testing.T) {
	facts, dev := setup(t)
	// A regular file named like a GPU node must not count.
	if err := os.WriteFile(filepath.Join(dev, "nvidia0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if code := run(nil, &out, &out, facts, dev); code != 6 || !strings.Contains(out.String(), "No devices were found") {
		t.Fatalf("exit %d, %q", code, out.String())
	}
}

func TestNoDriver(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"-L"}, &out, &out, filepath.Join(t.TempDir(), "missing"), "/dev"); code != 9 {
		t.Fatalf("exit %d, %q", code, out.String())
	}
}

func TestBadField(t *testing.T) {
	facts, dev := setup(t, 0)
	var out, errb bytes.Buffer
	if code := run([]string{"--query-gpu=uuid,bogus", "--format=csv"}, &out, &errb, facts, dev); code != 2 || !strings.Contains(errb.String(), "bogus") {
		t.Fatalf("exit %d, %q", code, errb.String())
	}
}

func TestHostView(t *testing.T) {
	facts, _ := setup(t)
	var out, errb bytes.Buffer
	if code := run([]string{"--query-gpu=index,uuid", "--format=csv,noheader"}, &out, &errb, facts, ""); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if got := strings.TrimSpace(out.String()); got != "0, GPU-aaaa\n1, GPU-bbbb" {
		t.Fatalf("host view %q", got)
	}
}
