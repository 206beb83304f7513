package sim_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

func discover(t *testing.T, value string) (gpu.Node, *sim.Node, *nvmlinv.Inventory) {
	t.Helper()
	spec, err := sim.ParseSpec(value)
	if err != nil {
		t.Fatal(err)
	}
	n := sim.New(spec)
	inv, err := nvmlinv.New(n.NVML(), nvmlinv.WithNodeLookup(n.Nodes()), nvmlinv.WithCaps(n.ProcFS(), "the SIMULATED driver's procfs"),
		nvmlinv.WithSimulated(), nvmlinv.WithWaitSlice(20*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inv.Close() })
	node, err := inv.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return node, n, inv
}

func TestDeterministicNode(t *testing.T) {
	one, _, _ := discover(t, "sim:a100-80gb")
	eight, _, _ := discover(t, "sim:a100-80gb*8")
	again, _, _ := discover(t, "sim:a100-80gb*8")
	if len(one.Devices) != 1 || len(eight.Devices) != 8 {
		t.Fatalf("got %d and %d GPUs", len(one.Devices), len(eight.Devices))
	}
	if one.Devices[0].UUID != eight.Devices[0].UUID {
		t.Error("GPU 0 differs between the 1-GPU and 8-GPU simulated nodes")
	}
	uuidRE := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i, d := range eight.Devices {
		if !reflect.DeepEqual(d, again.Devices[i]) {
			t.Errorf("GPU %d differs between two builds: %+v vs %+v", i, d, again.Devices[i])
		}
		if !uuidRE.MatchString(d.UUID) || seen[d.UUID] {
			t.Errorf("GPU %d UUID %q is malformed or repeated", i, d.UUID)
		}
		seen[d.UUID] = true
		if d.Minor != i || d.Node.Path != "/dev/nvidia"+string(rune('0'+i)) || d.Node.Major != gpu.NVIDIAMajor {
			t.Errorf("GPU %d node = %+v", i, d.Node)
		}
		if d.Name != "NVIDIA A100-SXM4-80GB" || d.MemoryBytes != 80<<30 {
			t.Errorf("GPU %d = %s with %d bytes", i, d.Name, d.MemoryBytes)
		}
		if d.PCIBusID != sim.BusID(i)[4:] && d.PCIBusID != sim.BusID(i) {
			t.Errorf("GPU %d bus ID %q", i, d.PCIBusID)
		}
		if d.NUMANode != i/4 {
			t.Errorf("GPU %d NUMA node %d", i, d.NUMANode)
		}
	}
	if eight.DriverVersion != sim.DriverVersion || eight.CUDAVersion != "13.0" || !eight.Simulated {
		t.Errorf("node facts = %s / %s / simulated=%v", eight.DriverVersion, eight.CUDAVersion, eight.Simulated)
	}
	if len(eight.ControlNodes) != 4 {
		t.Errorf("control nodes = %+v", eight.ControlNodes)
	}
	a, b, c := eight.Devices[0].UUID, eight.Devices[1].UUID, eight.Devices[5].UUID
	if l := eight.Link(a, b); !l.NVLink || l.Level != 20 {
		t.Errorf("link 0-1 = %+v", l)
	}
	if l := eight.Link(a, c); !l.NVLink || l.Level != 50 || eight.Link(c, a) != l {
		t.Errorf("link 0-5 = %+v", l)
	}
}

func TestMIG(t *testing.T) {
	node, _, _ := discover(t, "sim:a100-80gb*4,mig=2")
	for _, d := range node.Devices {
		if d.MIGEnabled != (d.Index == 2) {
			t.Errorf("GPU %d MIG = %v", d.Index, d.MIGEnabled)
		}
	}
}

// driver= sets what NVML reports, and the CUDA version follows the branch.
func TestDriverOption(t *testing.T) {
	for _, tc := range []struct{ value, driver, cuda string }{
		{"sim:a100-80gb", sim.DriverVersion, "13.0"},
		{"sim:a100-80gb,driver=535.261.03", "535.261.03", "12.2"},
		{"sim:a100-80gb*2,driver=550.54.15", "550.54.15", "12.4"},
		{"sim:a100-80gb,driver=590.10", "590.10", "13.0"},
	} {
		node, _, _ := discover(t, tc.value)
		if node.DriverVersion != tc.driver || node.CUDAVersion != tc.cuda {
			t.Errorf("%s: driver %s CUDA %s, want %s and %s", tc.value, node.DriverVersion, node.CUDAVersion, tc.driver, tc.cuda)
		}
	}
}

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string
		wantErr string
	}{
		{in: "sim:a100-80gb", want: "sim:a100-80gb"},
		{in: "sim:a100-80gb*8", want: "sim:a100-80gb*8"},
		{in: "sim:a100-80gb*8,mig=1+3", want: "sim:a100-80gb*8,mig=1+3"},
		{in: "real", wantErr: "not a simulation value"},
		{in: "sim:h100", wantErr: "unknown simulated model"},
		{in: "sim:a100-80gb*0", wantErr: "from 1 to 16"},
		{in: "sim:a100-80gb*x", wantErr: "from 1 to 16"},
		{in: "sim:a100-80gb*2,mig=2", wantErr: "from 0 to 1"},
		{in: "sim:a100-80gb,foo=1", wantErr: "unknown option"},
		{in: "sim:a100-80gb*8,driver=535.261.03,mig=1", want: "sim:a100-80gb*8,mig=1,driver=535.261.03"},
		{in: "sim:a100-80gb,driver=535", wantErr: "not a driver version"},
		{in: "sim:a100-80gb,driver=390.157", wantErr: "older than the simulation knows"},
		{in: "sim:a100-80gb*4,mig=1,mig=2", wantErr: "twice"},
		{in: "sim:a100-80gb,", wantErr: "unknown option"},
	} {
		s, err := sim.ParseSpec(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || s.String() != tc.want {
			t.Errorf("%s: %v, %q", tc.in, err, s.String())
		}
	}
}

func TestHealthEvents(t *testing.T) {
	node, n, inv := discover(t, "sim:a100-80gb*2")
	target := node.Devices[1].UUID
	if err := n.InjectXid(target, 79); !errors.Is(err, sim.ErrNoWatcher) {
		t.Fatalf("inject before any watcher: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan gpu.HealthEvent, 4)
	done := make(chan error, 1)
	go func() { done <- inv.WatchHealth(ctx, node.UUIDs(), events) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := n.InjectXid(target, 79)
		if err == nil {
			break
		}
		if !errors.Is(err, sim.ErrNoWatcher) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, want := range []gpu.HealthEvent{{Kind: gpu.EventWatching}, {UUID: target, Kind: gpu.EventXid, Xid: 79}} {
		select {
		case e := <-events:
			if e.UUID != want.UUID || e.Kind != want.Kind || e.Xid != want.Xid {
				t.Fatalf("event = %+v, want %+v", e, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s event", want.Kind)
		}
	}
	if err := n.InjectXid("GPU-nope", 1); err == nil || !strings.Contains(err.Error(), node.Devices[0].UUID) {
		t.Errorf("unknown UUID error = %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("WatchHealth did not stop with its context")
	}
}

func TestLookup(t *testing.T) {
	l := sim.New(sim.Spec{Model: "a100-80gb", Count: 2}).Nodes()
	for path, want := range map[string]bool{"/dev/nvidia0": true, "/dev/nvidia1": true, "/dev/nvidia2": false, "/dev/nvidiactl": true, "/dev/nvidia-uvm": true, "/dev/sda": false} {
		_, ok, err := l.Lookup(path)
		if err != nil || ok != want {
			t.Errorf("%s: ok=%v err=%v", path, ok, err)
		}
	}
}

func TestResolveFromDriverRoot(t *testing.T) {
	root := t.TempDir()
	if v, err := sim.Resolve("sim:a100-80gb", ""); err != nil || v != "sim:a100-80gb" {
		t.Fatalf("a plain value: %q, %v; want it unchanged", v, err)
	}
	if _, err := sim.Resolve(sim.FromDriverRoot, ""); err == nil {
		t.Error("no driver root: want an error naming --driver-root")
	}
	if _, err := sim.Resolve(sim.FromDriverRoot, root); err == nil || !strings.Contains(err.Error(), sim.NodeFile) {
		t.Errorf("no node file: %v; want an error naming %s", err, sim.NodeFile)
	}
	for _, bad := range []string{"real", sim.FromDriverRoot, ""} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, sim.NodeFile)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, sim.NodeFile), []byte(bad+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := sim.Resolve(sim.FromDriverRoot, root); err == nil {
			t.Errorf("node file holding %q: want an error", bad)
		}
	}
	if err := os.WriteFile(filepath.Join(root, sim.NodeFile), []byte("sim:h100-80gb*8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := sim.Resolve(sim.FromDriverRoot, root); err != nil || v != "sim:h100-80gb*8" {
		t.Errorf("Resolve = %q, %v; want sim:h100-80gb*8", v, err)
	}
}

func TestHostSeedsUUIDs(t *testing.T) {
	uuids := func(v string) []string {
		t.Helper()
		spec, err := sim.ParseSpec(v)
		if err != nil {
			t.Fatal(err)
		}
		if spec.String() != v {
			t.Errorf("ParseSpec(%q).String() = %q; want it back", v, spec.String())
		}
		n := sim.New(spec)
		var out []string
		for i := range 2 {
			d, ret := n.NVML().DeviceGetHandleByIndex(i)
			if ret != nvml.SUCCESS {
				t.Fatalf("device %d: %v", i, ret)
			}
			u, _ := d.GetUUID()
			out = append(out, u)
		}
		return out
	}
	plain, a, b := uuids("sim:a100-80gb*2"), uuids("sim:a100-80gb*2,host=node-a"), uuids("sim:a100-80gb*2,host=node-b")
	if plain[0] != sim.UUID("a100-80gb", 0) {
		t.Errorf("without host= GPU 0 is %s; want the model's %s", plain[0], sim.UUID("a100-80gb", 0))
	}
	if a[0] == plain[0] || a[0] == b[0] || a[1] == b[1] || a[0] == a[1] {
		t.Errorf("host= must give each node its own UUIDs: plain %v, node-a %v, node-b %v", plain, a, b)
	}
	if again := uuids("sim:a100-80gb*2,host=node-a"); again[0] != a[0] {
		t.Errorf("host=node-a names %s, then %s; want the same in every process", a[0], again[0])
	}
	for _, bad := range []string{"sim:a100-80gb,host=", "sim:a100-80gb,host=a/b"} {
		if _, err := sim.ParseSpec(bad); err == nil {
			t.Errorf("ParseSpec(%q): want an error", bad)
		}
	}
}
