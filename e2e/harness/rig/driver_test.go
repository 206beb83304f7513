package rig

import (
	"context"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/e2e/harness/driverroot"
)

func TestChooseDriver(t *testing.T) {
	tests := []struct {
		layout, mirror string
		wantLayout     string
		wantSays       []string
		wantErr        string
	}{
		{layout: Simulated, wantLayout: Simulated, wantSays: []string{"SIMULATED driver root: DRIVER_LAYOUT=simulated"}},
		{layout: "debain", wantErr: `DRIVER_LAYOUT="debain": use flat, debian or simulated`},
		// An empty cache and a mirror nobody listens on: the simulated root, said plainly.
		{layout: "", mirror: "http://127.0.0.1:9/debian", wantLayout: Simulated,
			wantSays: []string{"SIMULATED driver root: Debian archive unreachable (", "placeholders"}},
		{layout: driverroot.Debian, mirror: "http://127.0.0.1:9/debian", wantLayout: Simulated,
			wantSays: []string{"Debian archive unreachable"}},
	}
	for _, tt := range tests {
		t.Run(tt.layout+" "+tt.mirror, func(t *testing.T) {
			if tt.mirror != "" {
				if testing.Short() {
					t.Skip("runs apt-get update against a closed port")
				}
				t.Setenv("XDG_CACHE_HOME", t.TempDir())
				t.Setenv("NVINJECT_DEBIAN_MIRROR", tt.mirror)
			}
			d, err := ChooseDriver(context.Background(), tt.layout, nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ChooseDriver(%q) = %v, want error %q", tt.layout, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s", d)
			if d.Layout != tt.wantLayout || d.Real() {
				t.Errorf("layout %q real %v, want %q", d.Layout, d.Real(), tt.wantLayout)
			}
			for _, w := range tt.wantSays {
				if !strings.Contains(d.String(), w) {
					t.Errorf("%q does not say %q", d, w)
				}
			}
		})
	}
}

// The real root, when it can be had: Real, and named with its layout and version.
func TestChooseDriverReal(t *testing.T) {
	d, err := ChooseDriver(context.Background(), driverroot.Flat, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Real() {
		t.Skipf("no real driver root here: %s", d)
	}
	for _, w := range []string{"REAL NVIDIA driver user space " + driverroot.DriverVersion, "flat layout", d.Source, "the GPU is SIMULATED"} {
		if !strings.Contains(d.String(), w) {
			t.Errorf("%q does not say %q", d, w)
		}
	}
}
