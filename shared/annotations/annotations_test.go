package annotations

import (
	"slices"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	names := []string{"nvidia.com/gpu=GPU-1", "nvidia.com/gpu=GPU-2"}
	got, err := Parse(Format(names))
	if err != nil || !slices.Equal(got, names) {
		t.Fatalf("Parse(Format(%v)) = %v, %v", names, got, err)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{" nvidia.com/gpu=GPU-1 , nvidia.com/gpu=GPU-2", []string{"nvidia.com/gpu=GPU-1", "nvidia.com/gpu=GPU-2"}},
		{"", nil},
		{"nvidia.com/gpu=GPU-1,", nil},
		{"gpu=GPU-1", nil},
		{"nvidia.com/gpu=", nil},
		{"nvidia.com/=x", nil},
	} {
		got, err := Parse(tc.in)
		if (err != nil) != (tc.want == nil) || !slices.Equal(got, tc.want) {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
