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
			v, err := Format(got)
			if err != nil || v != strings.Join(tt.want, ",") {
				t.Fatalf("Format(%v) = %q, %v", got, v, err)
			}
		})
	}
}

func TestFormatRefusesEmptyAndInvalid(t *testing.T) {
	if _, err := Format(nil); err == nil {
		t.Fatal("Format(nil) succeeded; want an error")
	}
	if _, err := Format([]string{"nvidia.com/gpu=0,nvidia.com/gpu=1"}); err == nil {
		t.Fatal("Format accepted a name containing a comma")
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
		v, err := Format(names)
		if err != nil {
			t.Fatalf("Format(Parse(%q)) failed: %v", value, err)
		}
		again, err := Parse(v)
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
