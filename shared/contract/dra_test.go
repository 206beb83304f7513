package contract

import "testing"

func TestDRASemVer(t *testing.T) {
	for in, want := range map[string]string{"580.95.05": "580.95.5", "13.0": "13.0.0", "8": "8.0.0", "": "", "1.2.3.4": "", "5.x": ""} {
		got, ok := DRASemVer(in)
		if got != want || ok != (want != "") {
			t.Errorf("DRASemVer(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
