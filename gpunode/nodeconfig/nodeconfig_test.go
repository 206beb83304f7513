package nodeconfig

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseXids(t *testing.T) {
	for in, want := range map[string][]uint64{"": nil, "none": nil, "79": {79}, " 13, 31 ,13": {13, 31}} {
		got, err := ParseXids(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseXids(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

func FuzzParseXids(f *testing.F) {
	for _, s := range []string{DefaultIgnoredXids, "none", "", "79", "1,,2", "-1", "18446744073709551616"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseXids(v)
		if err != nil {
			return
		}
		again, err := ParseXids(joinXids(got))
		if err != nil || !slices.Equal(again, got) {
			t.Fatalf("round trip of %q: %v -> %v, %v", v, got, again, err)
		}
	})
}

func joinXids(xs []uint64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}
