package injbench

import (
	"testing"
	"time"
)

func ms2d(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m) * time.Millisecond
	}
	return out
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		in                    []time.Duration
		median, p90, min, max time.Duration
	}{
		{"empty", nil, 0, 0, 0, 0},
		{"one", ms2d(7), 7 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond, 7 * time.Millisecond},
		{"odd unsorted", ms2d(30, 10, 20), 20 * time.Millisecond, 30 * time.Millisecond, 10 * time.Millisecond, 30 * time.Millisecond},
		{"even takes the middle mean", ms2d(4, 1, 3, 2), 2500 * time.Microsecond, 4 * time.Millisecond, time.Millisecond, 4 * time.Millisecond},
		{"p90 nearest rank of 10", ms2d(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 5500 * time.Microsecond, 9 * time.Millisecond, time.Millisecond, 10 * time.Millisecond},
		{"p90 nearest rank of 20", ms2d(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20), 10500 * time.Microsecond, 18 * time.Millisecond, time.Millisecond, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]time.Duration(nil), tc.in...)
			s := Summarize(tc.in)
			if s.N != len(tc.in) || s.Median != tc.median || s.P90 != tc.p90 || s.Min != tc.min || s.Max != tc.max {
				t.Errorf("Summarize(%v) = %+v, want n=%d median=%v p90=%v min=%v max=%v", tc.in, s, len(tc.in), tc.median, tc.p90, tc.min, tc.max)
			}
			for i := range in {
				if in[i] != tc.in[i] {
					t.Fatalf("Summarize reordered its input: %v", tc.in)
				}
			}
		})
	}
}

func TestRatio(t *testing.T) {
	if got := Ratio(150*time.Millisecond, 100*time.Millisecond); got != 1.5 {
		t.Errorf("Ratio(150ms, 100ms) = %v, want 1.5", got)
	}
	if got := Ratio(time.Second, 0); got != 0 {
		t.Errorf("Ratio(1s, 0) = %v, want 0", got)
	}
}
