package gpuselect

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu"
)

func migGPU(index int, profiles ...string) gpu.Device {
	d := gpu.Device{UUID: fmt.Sprintf("GPU-%d", index), Index: index, Minor: index, MIGEnabled: true}
	for i, p := range profiles {
		d.MIG = append(d.MIG, gpu.MIGDevice{UUID: fmt.Sprintf("MIG-%d-%d", index, i), ParentUUID: d.UUID, GPUInstance: i + 1, Profile: p})
	}
	return d
}

func wholeGPU(index int) gpu.Device {
	return gpu.Device{UUID: fmt.Sprintf("GPU-%d", index), Index: index, Minor: index}
}

// render lists each resource as name=unit,unit.
func render(rs []Resource) string {
	var parts []string
	for _, r := range rs {
		var us []string
		for _, u := range r.Units {
			us = append(us, u.UUID())
		}
		parts = append(parts, r.Name+"="+strings.Join(us, ","))
	}
	return strings.Join(parts, " ")
}

func TestResources(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mig     MIGStrategy
		devs    []gpu.Device
		want    string
		wantErr string
	}{
		{name: "none", mig: MIGNone, devs: []gpu.Device{wholeGPU(0), wholeGPU(1)}, want: "nvidia.com/gpu=GPU-0,GPU-1"},
		{name: "single without MIG is none", mig: MIGSingle, devs: []gpu.Device{wholeGPU(0)}, want: "nvidia.com/gpu=GPU-0"},
		{name: "single", mig: MIGSingle, devs: []gpu.Device{migGPU(1, "1g.10gb", "1g.10gb"), migGPU(0, "1g.10gb")}, want: "nvidia.com/gpu=MIG-0-0,MIG-1-0,MIG-1-1"},
		{name: "single mixing MIG on and off", mig: MIGSingle, devs: []gpu.Device{migGPU(0, "1g.10gb"), wholeGPU(1)}, wantErr: "GPU(s) 0 have it on and 1 off"},
		{name: "single mixing profiles", mig: MIGSingle, devs: []gpu.Device{migGPU(0, "1g.10gb", "3g.40gb")}, wantErr: "1g.10gb, 3g.40gb"},
		{name: "mixed", mig: MIGMixed, devs: []gpu.Device{wholeGPU(0), migGPU(1, "3g.40gb", "1g.10gb", "1g.10gb")},
			want: "nvidia.com/gpu=GPU-0 nvidia.com/mig-1g.10gb=MIG-1-1,MIG-1-2 nvidia.com/mig-3g.40gb=MIG-1-0"},
		{name: "mixed, a MIG GPU without instances publishes nothing", mig: MIGMixed, devs: []gpu.Device{migGPU(0)}, want: "nvidia.com/gpu="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Resources(tc.devs, tc.mig, "nvidia.com/gpu")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r := render(got); r != tc.want {
				t.Errorf("got %s\nwant %s", r, tc.want)
			}
		})
	}
}

func TestSelectMIG(t *testing.T) {
	broken := migGPU(1, "1g.10gb")
	broken.MIGErr = fmt.Errorf("no capability file")
	devs := []gpu.Device{wholeGPU(0), broken, migGPU(2, "1g.10gb")}
	got, skipped, err := Select(devs, Selector{All: true}, MIGMixed)
	if err != nil || len(got) != 2 || got[1].Index != 2 || len(skipped) != 1 || !strings.Contains(skipped[0].Reason, "no capability file") {
		t.Fatalf("mixed, all: %v, skipped %v, %v", got, skipped, err)
	}
	if _, _, err := Select(devs, Selector{Indices: []int{1}}, MIGMixed); err == nil || !strings.Contains(err.Error(), "cannot be read") {
		t.Errorf("naming the broken MIG GPU: %v", err)
	}
	if _, _, err := Select(devs, Selector{Indices: []int{2}}, MIGNone); err == nil || !strings.Contains(err.Error(), "MIG_STRATEGY=single or mixed") {
		t.Errorf("naming a MIG GPU under none: %v", err)
	}
}
