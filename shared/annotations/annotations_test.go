package annotations

import (
	"slices"
	"strings"
	"testing"
)

const uuid0 = "GPU-4c8f1b0e-1a2b-5c3d-8e4f-0123456789ab"

func TestFormatParse(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		want    []string
		wantErr string
	}{
		{name: "one", value: "nvidia.com/gpu=" + uuid0, want: []string{"nvidia.com/gpu=" + uuid0}},
		{name: "two with blanks", value: " nvidia.com/gpu=0 , nvidia.com/gpu=1", want: []string{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}},
		{name: "empty", value: "  ", wantErr: "is empty"},
		{name: "empty entry", value: "nvidia.com/gpu=0,", wantErr: "not a qualified"},
		{name: "unqualified", value: "gpu0", wantErr: "not a qualified"},
		{name: "no class", value: "nvidia.com=0", wantErr: "not a qualified"},
		{name: "bad vendor", value: "-nvidia.com/gpu=0", wantErr: "vendor"},
		{name: "bad class", value: "nvidia.com/g pu=0", wantErr: "class"},
		{name: "empty name", value: "nvidia.com/gpu=", wantErr: "name"},
		{name: "empty class", value: "nvidia.com/=x", wantErr: "class"},
		{name: "bad name", value: "nvidia.com/gpu=GPU-1/2", wantErr: "name"},
		{name: "duplicate", value: "nvidia.com/gpu=0,nvidia.com/gpu=0", wantErr: "twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) error = %v, want one containing %q", tt.value, err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("Parse(%q) = %v, %v; want %v", tt.value, got, err, tt.want)
			}
			if v := Format(got); v != strings.Join(tt.want, ",") {
				t.Fatalf("Format(%v) = %q", got, v)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	names := []string{"nvidia.com/gpu=GPU-1", "nvidia.com/gpu=GPU-2"}
	got, err := Parse(Format(names))
	if err != nil || !slices.Equal(got, names) {
		t.Fatalf("Parse(Format(%v)) = %v, %v", names, got, err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"nvidia.com/gpu=" + uuid0, "nvidia.com/gpu=0,nvidia.com/gpu=1", "", ",", "a/b=c", "a/b=c:d", "x/y=", "/=", "nvidia.com/gpu=0 ,\tnvidia.com/gpu=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		names, err := Parse(value)
		if err != nil {
			return
		}
		again, err := Parse(Format(names))
		if err != nil || !slices.Equal(again, names) {
			t.Fatalf("round trip of %q: %v, %v; want %v", value, again, err, names)
		}
		for _, n := range names {
			if strings.ContainsAny(n, ", \t") {
				t.Fatalf("parsed name %q holds a separator or blank", n)
			}
		}
	})
}
