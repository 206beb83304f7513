package sim_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/gpu/nvcaps"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

func TestParseSpecMIG(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string
		wantErr []string
	}{
		{in: "sim:a100-80gb*8,mig=3", want: "sim:a100-80gb*8,mig=3"},
		{in: "sim:h100-80gb*8,mig=3:1g.10gb+1g.10gb+3g.40gb", want: "sim:h100-80gb*8,mig=3:1g.10gb*2+3g.40gb"},
		{in: "sim:a100-80gb*8,mig=0+1:7g.80gb/2:3g.40gb*2/5", want: "sim:a100-80gb*8,mig=0+1:7g.80gb/2:3g.40gb*2/5"},
		{in: "sim:a100-80gb,mig=0:4g.40gb+3g.40gb", want: "sim:a100-80gb,mig=0:4g.40gb+3g.40gb"},
		{in: "sim:a100-80gb,mig=0:1g.10gb*7", want: "sim:a100-80gb,mig=0:1g.10gb*7"},
		{in: "sim:a100-80gb,mig=0:1g.20gb*4", want: "sim:a100-80gb,mig=0:1g.20gb*4"},
		{in: "sim:a100-80gb,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb+me", want: "sim:a100-80gb,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb+me"},
		{in: "sim:a100-80gb,mig=0:1c.3g.40gb*2", want: "sim:a100-80gb,mig=0:1c.3g.40gb*2"},
		{in: "sim:a100-40gb,mig=0:1g.5gb*7", want: "sim:a100-40gb,mig=0:1g.5gb*7"},
		{in: "sim:h200-141gb*8,mig=0+1:1g.18gb*7/4:7g.141gb", want: "sim:h200-141gb*8,mig=0+1:1g.18gb*7/4:7g.141gb"},
		{in: "sim:h200-141gb,mig=0:3g.71gb*2", want: "sim:h200-141gb,mig=0:3g.71gb*2"},
		{in: "sim:h200-141gb,mig=0:1g.35gb*4", want: "sim:h200-141gb,mig=0:1g.35gb*4"},
		// The example: an A100 has 7 slices.
		{in: "sim:a100-80gb*8,mig=3:1g.10gb*8", wantErr: []string{"GPU 3", "1g.10gb*8 does not fit", "7 compute slices", "after 1g.10gb*7 there is no room for 1g.10gb", "what fits beside 1g.10gb*7: none"}},
		{in: "sim:a100-80gb,mig=0:4g.40gb*2", wantErr: []string{"GPU 0", "what fits beside 4g.40gb: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb"}},
		{in: "sim:h100-80gb,mig=0:3g.40gb*2+1g.10gb", wantErr: []string{"no room for 1g.10gb", "beside 3g.40gb*2: none"}},
		{in: "sim:h200-141gb,mig=0:7g.141gb+1g.18gb", wantErr: []string{"no room for 1g.18gb"}},
		{in: "sim:a100-80gb,mig=0:1g.10gb+me*2", wantErr: []string{"no room for 1g.10gb+me"}},
		{in: "sim:a100-80gb,mig=0:1g.5gb", wantErr: []string{`"1g.5gb" is not a MIG profile of a100-80gb`, "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"}},
		{in: "sim:h200-141gb,mig=0:1g.10gb", wantErr: []string{"1g.18gb"}},
		{in: "sim:a100-80gb*2,mig=0/0:7g.80gb", wantErr: []string{"GPU 0 twice"}},
		{in: "sim:a100-80gb*2,mig=0+0", wantErr: []string{"GPU 0 twice"}},
		{in: "sim:a100-80gb,mig=0:", wantErr: []string{"empty profile"}},
		{in: "sim:a100-80gb,mig=0:7g.80gb+", wantErr: []string{"empty profile"}},
		{in: "sim:a100-80gb,mig=0:1g.10gb*0", wantErr: []string{"from 1 to 16"}},
		{in: "sim:a100-80gb,mig=0:1g.10gb*x", wantErr: []string{"from 1 to 16"}},
		{in: "sim:a100-80gb,mig=:7g.80gb", wantErr: []string{`mig index ""`, "mig=I[+J][:PROFILE"}},
		{in: "sim:a100-80gb*2,mig=2:7g.80gb", wantErr: []string{"from 0 to 1"}},
	} {
		s, err := sim.ParseSpec(tc.in)
		if tc.wantErr != nil {
			if err == nil {
				t.Errorf("%s: no error", tc.in)
				continue
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q does not say %q", tc.in, err, w)
				}
			}
			continue
		}
		if err != nil || s.String() != tc.want {
			t.Errorf("%s: %v, %q; want %q", tc.in, err, s.String(), tc.want)
		}
	}
}

// want is one expected MIG device: its GI, CI, profile, memory in MiB,
// slices, SMs and placement.
type want struct {
	gi, ci       int
	profile      string
	mib          uint64
	g, c, sms    int
	start, size  int
	giCap, ciCap int64
}

func TestMIGDiscovery(t *testing.T) {
	for _, tc := range []struct {
		value string
		gpu   int
		want  []want
	}{
		{"sim:a100-80gb*2,mig=1:1g.10gb*2+2g.20gb+3g.40gb", 1, []want{
			{0, 0, "1g.10gb", 9856, 1, 1, 14, 0, 1, 138, 139},
			{1, 0, "1g.10gb", 9856, 1, 1, 14, 1, 1, 147, 148},
			{2, 0, "2g.20gb", 19968, 2, 2, 28, 2, 2, 156, 157},
			{3, 0, "3g.40gb", 40192, 3, 3, 42, 4, 4, 165, 166},
		}},
		{"sim:a100-80gb,mig=0:7g.80gb", 0, []want{{0, 0, "7g.80gb", 80384, 7, 7, 98, 0, 8, 3, 4}}},
		{"sim:a100-80gb,mig=0:1c.3g.40gb+1g.20gb+1g.10gb+me", 0, []want{
			{0, 0, "1c.3g.40gb", 40192, 3, 1, 14, 0, 4, 3, 4},
			{1, 0, "1g.20gb", 19968, 1, 1, 14, 4, 2, 12, 13},
			{2, 0, "1g.10gb+me", 9856, 1, 1, 14, 6, 1, 21, 22},
		}},
		{"sim:h100-80gb*8,mig=3:1g.10gb+1g.10gb+3g.40gb", 3, []want{
			{0, 0, "1g.10gb", 10240, 1, 1, 16, 0, 1, 408, 409},
			{1, 0, "1g.10gb", 10240, 1, 1, 16, 1, 1, 417, 418},
			{2, 0, "3g.40gb", 40960, 3, 3, 48, 4, 3, 426, 427},
		}},
		{"sim:h100-80gb,mig=0:4g.40gb+2g.20gb+1g.20gb", 0, []want{
			{0, 0, "4g.40gb", 40960, 4, 4, 64, 0, 4, 3, 4},
			{1, 0, "2g.20gb", 20480, 2, 2, 32, 4, 2, 12, 13},
			{2, 0, "1g.20gb", 20480, 1, 1, 16, 6, 1, 21, 22},
		}},
		{"sim:h200-141gb*2,mig=1:1g.18gb*2+2g.35gb+3g.71gb", 1, []want{
			{0, 0, "1g.18gb", 18432, 1, 1, 16, 0, 1, 138, 139},
			{1, 0, "1g.18gb", 18432, 1, 1, 16, 1, 1, 147, 148},
			{2, 0, "2g.35gb", 35840, 2, 2, 32, 2, 2, 156, 157},
			{3, 0, "3g.71gb", 72704, 3, 3, 48, 4, 3, 165, 166},
		}},
		{"sim:h200-141gb,mig=0:7g.141gb", 0, []want{{0, 0, "7g.141gb", 144384, 7, 7, 112, 0, 7, 3, 4}}},
	} {
		t.Run(tc.value, func(t *testing.T) {
			node, _, _ := discover(t, tc.value)
			again, _, _ := discover(t, tc.value)
			if !reflect.DeepEqual(node, again) {
				t.Errorf("two builds of %s discover differently", tc.value)
			}
			for _, d := range node.Devices {
				if d.Index != tc.gpu && (d.MIGEnabled || len(d.MIG) > 0) {
					t.Errorf("GPU %d: MIG %v with %d devices", d.Index, d.MIGEnabled, len(d.MIG))
				}
			}
			parent := node.Devices[tc.gpu]
			if !parent.MIGEnabled || len(parent.MIG) != len(tc.want) {
				t.Fatalf("GPU %d: MIG %v, devices %+v", tc.gpu, parent.MIGEnabled, parent.MIG)
			}
			caps := func(minor int64) gpu.DeviceNode {
				return gpu.DeviceNode{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), Type: "c", Major: sim.CapsMajor, Minor: minor}
			}
			for i, w := range tc.want {
				exp := gpu.MIGDevice{
					UUID: sim.MIGUUID(parent.UUID, w.gi, w.ci), ParentUUID: parent.UUID, GPUInstance: w.gi, ComputeInstance: w.ci,
					Profile: w.profile, MemoryBytes: w.mib << 20, GPUSlices: w.g, ComputeSlices: w.c, Multiprocessors: w.sms,
					Placement: gpu.MIGPlacement{Start: w.start, Size: w.size},
					Parent:    gpu.DeviceNode{Path: fmt.Sprintf("/dev/nvidia%d", tc.gpu), Type: "c", Major: gpu.NVIDIAMajor, Minor: int64(tc.gpu)},
					GIAccess:  caps(w.giCap), CIAccess: caps(w.ciCap),
				}
				if got := parent.MIG[i]; got != exp {
					t.Errorf("MIG device %d:\n got %+v\nwant %+v", i, got, exp)
				}
			}
			if node.MIGConfig != caps(1) || node.MIGMonitor != caps(2) {
				t.Errorf("config %+v, monitor %+v", node.MIGConfig, node.MIGMonitor)
			}
		})
	}
}

func TestMIGUUIDs(t *testing.T) {
	node, _, _ := discover(t, "sim:a100-80gb*4,mig=0+2:1g.10gb*7/3:7g.80gb")
	re := regexp.MustCompile(`^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	count := 0
	for _, d := range node.Devices {
		for _, m := range d.MIG {
			count++
			if !re.MatchString(m.UUID) || seen[m.UUID] || m.ParentUUID != d.UUID {
				t.Errorf("GPU %d: MIG UUID %q is malformed, repeated or not its parent's", d.Index, m.UUID)
			}
			seen[m.UUID] = true
		}
	}
	if count != 15 {
		t.Errorf("%d MIG devices, want 15", count)
	}
	// The whole-GPU strategy still refuses or skips MIG GPUs.
	got, skipped, err := gpuselect.Select(node.Devices, gpuselect.Selector{All: true}, gpuselect.MIGNone)
	if err != nil || len(got) != 1 || got[0].Index != 1 || len(skipped) != 3 {
		t.Errorf("select all: %v, skipped %d, %v", got, len(skipped), err)
	}
}

func TestMIGModeWithoutInstances(t *testing.T) {
	node, _, _ := discover(t, "sim:h100-80gb*2,mig=1")
	if d := node.Devices[1]; !d.MIGEnabled || len(d.MIG) != 0 {
		t.Errorf("GPU 1: MIG %v, %d devices", d.MIGEnabled, len(d.MIG))
	}
	if node.MIGConfig.Path != "/dev/nvidia-caps/nvidia-cap1" {
		t.Errorf("config node %+v", node.MIGConfig)
	}
	plain, _, _ := discover(t, "sim:h100-80gb*2")
	if plain.MIGConfig != (gpu.DeviceNode{}) {
		t.Errorf("no MIG GPU, but config node %+v", plain.MIGConfig)
	}
}

// A layout changed on the running node, through NVML's calls, shows in the
// next Discover: new devices with their caps, destroyed ones gone, IDs reused.
func TestRuntimeLayoutChange(t *testing.T) {
	_, n, inv := discover(t, "sim:a100-80gb*2,mig=0:3g.40gb")
	ctx := context.Background()
	profiles := func() []string {
		t.Helper()
		node, err := inv.Discover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range node.Devices[0].MIG {
			out = append(out, fmt.Sprintf("%d/%d %s %s", m.GPUInstance, m.ComputeInstance, m.Profile, m.GIAccess.Path))
		}
		return out
	}
	if got := profiles(); !reflect.DeepEqual(got, []string{"0/0 3g.40gb /dev/nvidia-caps/nvidia-cap3"}) {
		t.Fatalf("before: %v", got)
	}
	gi, ci, err := n.CreateGPUInstance(0, "2g.20gb")
	if err != nil || gi != 1 || ci != 0 {
		t.Fatalf("create 2g.20gb: GI %d CI %d, %v", gi, ci, err)
	}
	if _, _, err := n.CreateGPUInstance(0, "1g.10gb"); err != nil {
		t.Fatal(err)
	}
	if got := profiles(); !reflect.DeepEqual(got, []string{"0/0 3g.40gb /dev/nvidia-caps/nvidia-cap3", "1/0 2g.20gb /dev/nvidia-caps/nvidia-cap12", "2/0 1g.10gb /dev/nvidia-caps/nvidia-cap21"}) {
		t.Fatalf("after creating: %v", got)
	}
	if _, _, err := n.CreateGPUInstance(0, "3g.40gb"); err == nil || !strings.Contains(err.Error(), "no room for 3g.40gb") || !strings.Contains(err.Error(), "what fits: none") {
		t.Errorf("create past the slices: %v", err)
	}
	if err := n.DestroyGPUInstance(0, 0); err != nil {
		t.Fatal(err)
	}
	if got := profiles(); !reflect.DeepEqual(got, []string{"1/0 2g.20gb /dev/nvidia-caps/nvidia-cap12", "2/0 1g.10gb /dev/nvidia-caps/nvidia-cap21"}) {
		t.Fatalf("after destroying GI 0: %v", got)
	}
	if gi, _, err := n.CreateGPUInstance(0, "1c.3g.40gb"); err != nil || gi != 0 {
		t.Fatalf("GI 0 is free again: GI %d, %v", gi, err)
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{n.DestroyGPUInstance(0, 9), "no GPU instance 9"},
		{n.DestroyGPUInstance(1, 0), "MIG mode off"},
		{n.DestroyGPUInstance(2, 0), "GPUs 0 to 1"},
		{second(n.CreateGPUInstance(1, "7g.80gb")), "mig=1"},
		{second(n.CreateGPUInstance(0, "7g.81gb")), "7g.80gb"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("error %v does not say %q", tc.err, tc.want)
		}
	}
}

func second(_, _ int, err error) error { return err }

// The simulated driver refuses what the real one does, through NVML itself.
func TestSimulatedDriverRules(t *testing.T) {
	_, n, inv := discover(t, "sim:a100-80gb*2,mig=0:3g.40gb")
	dev, _ := n.NVML().DeviceGetHandleByIndex(0)
	gi, ret := dev.GetGpuInstanceById(0)
	if ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("destroy a GI holding a CI: %s, want In use", nvml.ErrorString(ret))
	}
	info, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.CreateComputeInstance(&info); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("a CI past the GI's slices: %s", nvml.ErrorString(ret))
	}
	p7, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_7_SLICE)
	if _, ret := dev.CreateGpuInstance(&p7); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("7g beside 3g: %s", nvml.ErrorString(ret))
	}
	p3, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_3_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(&p3, &nvml.GpuInstancePlacement{Start: 0, Size: 4}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("3g on the taken placement: %s", nvml.ErrorString(ret))
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&p3, &nvml.GpuInstancePlacement{Start: 1, Size: 4}); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("3g at a placement the profile lacks: %s", nvml.ErrorString(ret))
	}
	other, _ := n.NVML().DeviceGetHandleByIndex(1)
	if _, ret := other.CreateGpuInstance(&p3); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("a GI with MIG mode off: %s", nvml.ErrorString(ret))
	}
	// A GI without a CI has its access file, and no MIG device yet.
	p2, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	if _, ret := dev.CreateGpuInstance(&p2); ret != nvml.SUCCESS {
		t.Fatalf("2g beside 3g: %s", nvml.ErrorString(ret))
	}
	if _, err := fs.ReadFile(n.ProcFS(), strings.TrimPrefix(nvcaps.GPUInstanceFile(0, 1), "/")); err != nil {
		t.Errorf("the bare GI's access file: %v", err)
	}
	if _, err := fs.ReadFile(n.ProcFS(), strings.TrimPrefix(nvcaps.ComputeInstanceFile(0, 1, 0), "/")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a CI file for a GI without CIs: %v", err)
	}
	if node, err := inv.Discover(context.Background()); err != nil || len(node.Devices[0].MIG) != 1 {
		t.Errorf("with a bare GI: %v, %+v", err, node.Devices[0].MIG)
	}
}

// The capability files WriteProc puts in a driver root read back, through
// the same parser on disk, as the node's own procfs does.
func TestWriteProc(t *testing.T) {
	node, n, _ := discover(t, "sim:h200-141gb*2,mig=0:3g.71gb*2/1:7g.141gb")
	dir := t.TempDir()
	fromDisk := func() gpu.Node {
		t.Helper()
		if err := n.WriteProc(dir); err != nil {
			t.Fatal(err)
		}
		inv, err := nvmlinv.New(n.NVML(), nvmlinv.WithNodeLookup(n.Nodes()), nvmlinv.WithCaps(os.DirFS(dir), dir), nvmlinv.WithSimulated())
		if err != nil {
			t.Fatal(err)
		}
		got, err := inv.Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := fromDisk(); !reflect.DeepEqual(got, node) {
		t.Errorf("from disk:\n%+v\nfrom the simulated procfs:\n%+v", got.Devices, node.Devices)
	}
	data, err := os.ReadFile(dir + nvcaps.GPUInstanceFile(0, 1))
	if err != nil || string(data) != "DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n" {
		t.Errorf("GI 1's access file: %q, %v", data, err)
	}
	if err := n.DestroyGPUInstance(0, 1); err != nil {
		t.Fatal(err)
	}
	if got := fromDisk(); len(got.Devices[0].MIG) != 1 {
		t.Errorf("after destroying GI 1: %+v", got.Devices[0].MIG)
	}
	if _, err := os.Stat(dir + nvcaps.GPUInstanceFile(0, 1)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the destroyed GI's access file is still there: %v", err)
	}
}

// A MIG GPU whose capability files are missing carries an error naming the
// file; the node's other GPUs are discovered as before.
func TestMissingCaps(t *testing.T) {
	spec, err := sim.ParseSpec("sim:a100-80gb*2,mig=1:7g.80gb")
	if err != nil {
		t.Fatal(err)
	}
	n := sim.New(spec)
	access := []byte("DeviceFileMinor: 1\n")
	for _, tc := range []struct {
		fsys fstest.MapFS
		want string
	}{
		{fstest.MapFS{"proc/devices": {Data: []byte("Character devices:\n509 nvidia-caps\n")}}, nvcaps.GPUInstanceFile(1, 0)},
		{fstest.MapFS{
			"proc/driver/nvidia/capabilities/gpu1/mig/gi0/access":     {Data: access},
			"proc/driver/nvidia/capabilities/gpu1/mig/gi0/ci0/access": {Data: access},
		}, nvcaps.DevicesFile},
		{fstest.MapFS{
			"proc/devices": {Data: []byte("Character devices:\n509 nvidia-caps\n")},
			"proc/driver/nvidia/capabilities/gpu1/mig/gi0/access":     {Data: access},
			"proc/driver/nvidia/capabilities/gpu1/mig/gi0/ci0/access": {Data: access},
		}, nvcaps.ConfigFile},
	} {
		inv, err := nvmlinv.New(n.NVML(), nvmlinv.WithNodeLookup(n.Nodes()), nvmlinv.WithCaps(tc.fsys, "a test root"))
		if err != nil {
			t.Fatal(err)
		}
		node, err := inv.Discover(context.Background())
		if err != nil {
			t.Fatalf("a MIG GPU's missing caps failed the whole discovery: %v", err)
		}
		if len(node.Devices) != 2 || node.Devices[0].MIGErr != nil {
			t.Fatalf("the GPU without MIG is not discovered cleanly beside the broken one: %+v", node.Devices)
		}
		err = node.Devices[1].MIGErr
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "a test root") {
			t.Errorf("GPU 1's MIG error %v does not name %s", err, tc.want)
		}
	}
}

// Layout changes while discovery runs are safe: a Discover sees a whole
// layout, or the GPU's MIG read fails on an instance that went away, as on
// a real node.
func TestLayoutChangeDuringDiscover(t *testing.T) {
	_, n, inv := discover(t, "sim:a100-80gb*2,mig=0+1")
	done := make(chan error, 1)
	go func() {
		for range 50 {
			gi, _, err := n.CreateGPUInstance(0, "3g.40gb")
			if err == nil {
				err = n.DestroyGPUInstance(0, gi)
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for range 50 {
		node, err := inv.Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := node.Devices[0].MIGErr; err != nil {
			if !errors.Is(err, nvml.ERROR_NOT_FOUND) {
				t.Fatal(err)
			}
			continue
		}
		if m := node.Devices[0].MIG; len(m) > 1 || (len(m) == 1 && m[0].Profile != "3g.40gb") {
			t.Fatalf("a torn layout: %+v", m)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
