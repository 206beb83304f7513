package gpuselect

import (
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu"
)

func devs(n int, mig ...int) []gpu.Device {
	out := make([]gpu.Device, n)
	for i := range out {
		out[i] = gpu.Device{Index: i, Minor: i, UUID: "GPU-0000000" + string(rune('0'+i))}
	}
	for _, m := range mig {
		out[m].MIGEnabled = true
	}
	return out
}

func TestSelect(t *testing.T) {
	for _, tc := range []struct {
		name     string
		value    string
		devs     []gpu.Device
		want     []int
		skipped  int
		parseErr string
		selErr   string
	}{
		{name: "one UUID of eight", value: "GPU-00000005", devs: devs(8), want: []int{5}},
		{name: "lowercase prefix refused", value: "gpu-00000005", devs: devs(8), parseErr: "neither an index"},
		{name: "all", value: "all", devs: devs(3), want: []int{0, 1, 2}},
		{name: "ALL", value: "ALL", devs: devs(2), want: []int{0, 1}},
		{name: "none", value: "none", devs: devs(3)},
		{name: "void", value: "void", devs: devs(3)},
		{name: "indices", value: "2,0", devs: devs(3), want: []int{0, 2}},
		{name: "mixed", value: "GPU-00000001, 2", devs: devs(3), want: []int{1, 2}},
		{name: "empty", value: " ", devs: devs(1), parseErr: "selected-gpu-uuid"},
		{name: "blank entry", value: "0,,1", devs: devs(2), parseErr: "empty entry"},
		{name: "duplicate uuid", value: "GPU-00000001,GPU-00000001", devs: devs(2), parseErr: "twice"},
		{name: "uuid and its index", value: "GPU-00000001,1", devs: devs(2), selErr: "selected twice"},
		{name: "negative index", value: "-1", devs: devs(2), parseErr: "negative"},
		{name: "MIG device", value: "MIG-abc", devs: devs(2), parseErr: "select its parent"},
		{name: "unknown uuid lists present", value: "GPU-99999999", devs: devs(2), selErr: "GPU-00000000, 1=GPU-00000001"},
		{name: "index out of range", value: "4", devs: devs(2), selErr: "index 4 is not on this node"},
		{name: "all skips MIG", value: "all", devs: devs(3, 1), want: []int{0, 2}, skipped: 1},
		{name: "selected MIG GPU refused", value: "GPU-00000001", devs: devs(3, 1), selErr: "nvidia-smi -i 1 -mig 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sel, err := Parse(tc.value)
			if tc.parseErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.parseErr) {
					t.Fatalf("parse err = %v, want %q", err, tc.parseErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, skipped, err := Select(tc.devs, sel, MIGNone)
			if tc.selErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.selErr) {
					t.Fatalf("select err = %v, want %q", err, tc.selErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var idx []int
			for _, d := range got {
				idx = append(idx, d.Index)
			}
			if len(idx) != len(tc.want) {
				t.Fatalf("selected %v, want %v", idx, tc.want)
			}
			for i := range idx {
				if idx[i] != tc.want[i] {
					t.Fatalf("selected %v, want %v", idx, tc.want)
				}
			}
			if len(skipped) != tc.skipped {
				t.Fatalf("skipped %v, want %d", skipped, tc.skipped)
			}
			for _, s := range skipped {
				if !strings.Contains(s.Reason, "MIG") {
					t.Errorf("skip reason %q does not say why", s.Reason)
				}
			}
		})
	}
}

func TestMIGStrategy(t *testing.T) {
	if s, err := ParseMIGStrategy(""); err != nil || s != MIGNone {
		t.Errorf("default: %v %v", s, err)
	}
	for _, v := range []string{"none", "single", "mixed"} {
		if s, err := ParseMIGStrategy(v); err != nil || string(s) != v {
			t.Errorf("%s: %v %v", v, s, err)
		}
	}
	for _, v := range []string{"Mixed", "all", " single"} {
		if _, err := ParseMIGStrategy(v); err == nil || !strings.Contains(err.Error(), "use none") {
			t.Errorf("%q: %v", v, err)
		}
	}
}

// FuzzParse: any NVIDIA_VISIBLE_DEVICES value either fails cleanly or gives
// a selection that Select handles without panicking, never naming a GPU twice.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"all", "none", "void", "0,1", "GPU-00000001", "GPU-00000001,1", "", ",", "MIG-1", "-0", "00"} {
		f.Add(s)
	}
	d := devs(4, 3)
	f.Fuzz(func(t *testing.T, v string) {
		sel, err := Parse(v)
		if err != nil {
			return
		}
		got, _, err := Select(d, sel, MIGNone)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, g := range got {
			if seen[g.UUID] || g.MIGEnabled {
				t.Fatalf("%q selected %s twice or a MIG GPU", v, g.UUID)
			}
			seen[g.UUID] = true
		}
	})
}
