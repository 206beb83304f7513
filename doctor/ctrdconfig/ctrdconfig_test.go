package ctrdconfig

import (
	"slices"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		file        string
		handlers    []string
		cdiDirs     []string
		nriDisabled bool
		files       int
		wantErr     string
	}{
		// The drop-in's cdi_spec_dirs replaces the main file's array.
		{file: "with-dropin.toml", handlers: []string{"nvidia", "runc"}, cdiDirs: []string{"/etc/cdi", "/var/run/cdi"}, files: 2},
		{file: "plain.toml", handlers: []string{"runc"}, files: 1},
		{file: "v2-nri-disabled.toml", handlers: []string{"nvidia"}, nriDisabled: true, files: 1},
		{file: "broken.toml", wantErr: "parse containerd config"},
		{file: "absent.toml", wantErr: "pass --containerd-config"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			c, err := Load("testdata/" + tt.file)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Handlers, tt.handlers) || !slices.Equal(c.CDISpecDirs, tt.cdiDirs) || c.NRIDisabled != tt.nriDisabled || len(c.Files) != tt.files {
				t.Errorf("Load = %+v, want handlers %v cdi %v nriDisabled %t files %d", c, tt.handlers, tt.cdiDirs, tt.nriDisabled, tt.files)
			}
		})
	}
}
