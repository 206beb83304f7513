package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
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

// migSetup is setup with GPU 1 in MIG mode, holding two MIG devices
// whose CI access nodes are nvidia-cap22 and nvidia-cap31, and the
// container's caps nodes made under dev/nvidia-caps (major 509).
func migSetup(t *testing.T, caps map[string]int, minors ...int) (facts, dev string) {
	t.Helper()
	facts, dev = setup(t, minors...)
	f, err := simfacts.Read(facts)
	if err != nil {
		t.Fatal(err)
	}
	f.GPUs[1].MIG = true
	f.GPUs[1].MIGDevices = []simfacts.MIGDevice{
		{UUID: "MIG-1111", Profile: "3g.40gb", GPUInstance: 1, ComputeInstance: 0, CIAccessMinor: 22, MemoryMiB: 40192},
		{UUID: "MIG-2222", Profile: "1g.10gb", GPUInstance: 13, ComputeInstance: 0, CIAccessMinor: 31, MemoryMiB: 9728},
	}
	data, _ := json.Marshal(f)
	if err := os.WriteFile(facts, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dev, "nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, rdev := range caps {
		if err := syscall.Mknod(filepath.Join(dev, "nvidia-caps", name), syscall.S_IFCHR|0o444, rdev); err != nil {
			t.Skipf("cannot create device nodes here (needs root): %v", err)
		}
	}
	return facts, dev
}

func TestListsVisibleMIGDevices(t *testing.T) {
	gpu1 := "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbbb) [SIMULATED]"
	for _, tc := range []struct {
		name string
		caps map[string]int
		want []string
	}{
		{name: "its CI access node", caps: map[string]int{"nvidia-cap30": 509<<8 | 30, "nvidia-cap31": 509<<8 | 31},
			want: []string{gpu1, "  MIG 1g.10gb     Device  0: (UUID: MIG-2222)"}},
		{name: "both, any major", caps: map[string]int{"nvidia-cap22": 200<<8 | 22, "nvidia-cap31": 509<<8 | 31},
			want: []string{gpu1, "  MIG 3g.40gb     Device  0: (UUID: MIG-1111)", "  MIG 1g.10gb     Device  1: (UUID: MIG-2222)"}},
		{name: "parent only", want: []string{gpu1}},
		{name: "node named for the CI with another minor", caps: map[string]int{"nvidia-cap31": 509<<8 | 32}, want: []string{gpu1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			facts, dev := migSetup(t, tc.caps, 1)
			var out, errb bytes.Buffer
			if code := run([]string{"-L"}, &out, &errb, facts, dev); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if got := strings.Split(strings.TrimRight(out.String(), "\n"), "\n"); !slices.Equal(got, tc.want) {
				t.Errorf("-L:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// The MIG devices show under -L only; the query and table output for the
// GPUs stay as they were.
func TestMIGLeavesQueryAlone(t *testing.T) {
	facts, dev := migSetup(t, map[string]int{"nvidia-cap31": 509<<8 | 31}, 0, 1)
	var out, errb bytes.Buffer
	if code := run([]string{"--query-gpu=index,uuid,mig.mode.current", "--format=csv,noheader"}, &out, &errb, facts, dev); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if got := strings.TrimSpace(out.String()); got != "0, GPU-aaaa, Disabled\n1, GPU-bbbb, Enabled" {
		t.Fatalf("query %q", got)
	}
	out.Reset()
	if code := run([]string{"-L"}, &out, &errb, facts, ""); code != 0 || strings.Count(out.String(), "  MIG ") != 2 {
		t.Errorf("host view -L: exit %d\n%s", code, out.String())
	}
}
