package nvcaps

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/nvinject/nvinject/shared/gpu"
)

// access is an access file as the driver's nv_cap_procfs_read prints it.
func access(minor int) string {
	return fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)
}

const devices = `Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
234 nvidia-caps
508 nvidia-uvm

Block devices:
  7 loop
234 not-nvidia-caps
`

func TestFiles(t *testing.T) {
	for got, want := range map[string]string{
		GPUInstanceFile(0, 3):        "/proc/driver/nvidia/capabilities/gpu0/mig/gi3/access",
		ComputeInstanceFile(7, 2, 1): "/proc/driver/nvidia/capabilities/gpu7/mig/gi2/ci1/access",
		ConfigFile:                   "/proc/driver/nvidia/capabilities/mig/config",
		MonitorFile:                  "/proc/driver/nvidia/capabilities/mig/monitor",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}

func TestParseAccess(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: access(21), want: 21},
		{in: "DeviceFileMinor: 1\n", want: 1},
		{in: "DeviceFileMinor:4", want: 4},
		{in: "DeviceFileMode: 256\nDeviceFileMinor: 8191\n", want: 8191},
		{in: "\n\nDeviceFileMinor: 0\n\n", want: 0},
		{in: "DeviceFileMinor: 1048575", want: 1<<20 - 1},
		{in: "", wantErr: "no DeviceFileMinor"},
		{in: "DeviceFileMode: 292\n", wantErr: "no DeviceFileMinor"},
		{in: "DeviceFileMinor: 1\nDeviceFileMinor: 2\n", wantErr: "twice"},
		{in: "DeviceFileMinor: -1", wantErr: "not a minor number"},
		{in: "DeviceFileMinor: 1048576", wantErr: "not a minor number"},
		{in: "DeviceFileMinor: 0x10", wantErr: "not a minor number"},
		{in: "DeviceFileMinor:", wantErr: "not a minor number"},
		{in: "garbage", wantErr: "not \"Key: value\""},
	} {
		got, err := ParseAccess([]byte(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrNotCaps) {
				t.Errorf("%q: err = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParseMajor(t *testing.T) {
	for _, tc := range []struct {
		in      string
		name    string
		want    int64
		ok      bool
		wantErr string
	}{
		{in: devices, name: MajorName, want: 234, ok: true},
		{in: devices, name: "nvidia-uvm", want: 508, ok: true},
		{in: devices, name: "loop"},
		{in: devices, name: "not-nvidia-caps"},
		{in: "", name: MajorName},
		{in: "234 nvidia-caps\n", name: MajorName},
		{in: "Character devices:\nnvidia-caps\n", name: MajorName, wantErr: "not \"major name\""},
		{in: "Character devices:\nx nvidia-caps\n", name: MajorName, wantErr: "not a number"},
		{in: "Character devices:\n9999 nvidia-caps\n", name: MajorName, wantErr: "not a number"},
	} {
		got, ok, err := ParseMajor([]byte(tc.in), tc.name)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q %s: err = %v, want %q", tc.in, tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || ok != tc.ok || got != tc.want {
			t.Errorf("%q %s: %d %v %v; want %d %v", tc.in, tc.name, got, ok, err, tc.want, tc.ok)
		}
	}
}

func TestReader(t *testing.T) {
	proc := fstest.MapFS{
		"proc/devices": {Data: []byte(devices)},
		"proc/driver/nvidia/capabilities/mig/config":              {Data: []byte(access(1))},
		"proc/driver/nvidia/capabilities/gpu0/mig/gi2/access":     {Data: []byte(access(21))},
		"proc/driver/nvidia/capabilities/gpu0/mig/gi2/ci0/access": {Data: []byte(access(22))},
		"proc/driver/nvidia/capabilities/gpu1/mig/gi0/access":     {Data: []byte("DeviceFileMinor: x\n")},
		"proc/driver/nvidia/capabilities/gpu1/mig/gi1/access":     {Data: []byte(strings.Repeat("DeviceFileMode: 1\n", 1000))},
	}
	r := New(proc, "test root")
	for file, want := range map[string]gpu.DeviceNode{
		ConfigFile:                   {Path: "/dev/nvidia-caps/nvidia-cap1", Type: "c", Major: 234, Minor: 1},
		GPUInstanceFile(0, 2):        {Path: "/dev/nvidia-caps/nvidia-cap21", Type: "c", Major: 234, Minor: 21},
		ComputeInstanceFile(0, 2, 0): {Path: "/dev/nvidia-caps/nvidia-cap22", Type: "c", Major: 234, Minor: 22},
	} {
		got, err := r.Node(file)
		if err != nil || got != want {
			t.Errorf("%s: %+v, %v; want %+v", file, got, err, want)
		}
	}
	for file, want := range map[string][]string{
		MonitorFile:                  {MonitorFile, "test root", "not masked", "file does not exist"},
		GPUInstanceFile(0, 3):        {GPUInstanceFile(0, 3), "nvidia-smi mig -lgi"},
		GPUInstanceFile(1, 0):        {GPUInstanceFile(1, 0), "not a minor number"},
		GPUInstanceFile(1, 1):        {GPUInstanceFile(1, 1), "larger than 4096 bytes"},
		ComputeInstanceFile(0, 2, 1): {ComputeInstanceFile(0, 2, 1)},
	} {
		_, err := r.Node(file)
		if err == nil {
			t.Errorf("%s: no error", file)
			continue
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", file, err, w)
			}
		}
	}
	_, err := New(fstest.MapFS{}, "test root").Node(ConfigFile)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v does not wrap fs.ErrNotExist", err)
	}
}

func TestReaderMajor(t *testing.T) {
	cfg := fstest.MapFS{"proc/driver/nvidia/capabilities/mig/config": {Data: []byte(access(1))}}
	_, err := New(cfg, "test root").Node(ConfigFile)
	if err == nil || !strings.Contains(err.Error(), DevicesFile) {
		t.Errorf("no /proc/devices: %v", err)
	}
	cfg["proc/devices"] = &fstest.MapFile{Data: []byte("Character devices:\n195 nvidia-frontend\n")}
	_, err = New(cfg, "test root").Node(ConfigFile)
	if err == nil || !strings.Contains(err.Error(), "lists no nvidia-caps") || !strings.Contains(err.Error(), "lsmod") {
		t.Errorf("no nvidia-caps major: %v", err)
	}
}

// FuzzParseAccess: any access file content either fails with ErrNotCaps or
// gives a minor in range that prints back to the same value.
func FuzzParseAccess(f *testing.F) {
	for _, s := range []string{access(0), access(8191), "DeviceFileMinor:", "DeviceFileMinor: 1\nDeviceFileMinor: 1", ":", "\x00: 1", "DeviceFileMinor: +1"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		minor, err := ParseAccess(data)
		if err != nil {
			if !errors.Is(err, ErrNotCaps) {
				t.Fatalf("%q: error %v does not wrap ErrNotCaps", data, err)
			}
			return
		}
		if minor < 0 || minor > maxMinor {
			t.Fatalf("%q: minor %d out of range", data, minor)
		}
		if again, err := ParseAccess([]byte(access(int(minor)))); err != nil || again != minor {
			t.Fatalf("%q: %d does not print back: %d, %v", data, minor, again, err)
		}
	})
}

// FuzzParseDevices: any /proc/devices content either fails with ErrNotCaps
// or gives a major in range, found only in the character devices.
func FuzzParseDevices(f *testing.F) {
	for _, s := range []string{devices, "Character devices:\n", "Character devices:\n1 nvidia-caps", "Block devices:\n1 nvidia-caps\n", " devices:\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		major, ok, err := ParseMajor(data, MajorName)
		if err != nil {
			if !errors.Is(err, ErrNotCaps) {
				t.Fatalf("%q: error %v does not wrap ErrNotCaps", data, err)
			}
			return
		}
		if ok && (major < 0 || major > maxMajor || !strings.Contains(string(data), "Character devices:")) {
			t.Fatalf("%q: major %d", data, major)
		}
	})
}
