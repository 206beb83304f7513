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

func TestRatioCI(t *testing.T) {
	noisy := func(n int, scale float64) (a, b []time.Duration) {
		for i := range n {
			base := time.Duration(100+(i*37)%50) * time.Millisecond
			a = append(a, base+time.Duration((i*13)%17)*time.Millisecond)
			b = append(b, time.Duration(float64(base)*scale)+time.Duration((i*7)%19)*time.Millisecond)
		}
		return a, b
	}
	if _, _, ok := RatioCI(ms2d(1, 2, 3, 4, 5, 6, 7, 8, 9), ms2d(1, 2, 3, 4, 5, 6, 7, 8, 9)); ok {
		t.Error("an interval from 9 pairs")
	}
	a, b := noisy(40, 1)
	for i := range b {
		b[i] = a[i] * 6 / 5
	}
	lo, hi, ok := RatioCI(a, b)
	if !ok || lo > 1.2+1e-9 || hi < 1.2-1e-9 || hi-lo > 0.001 {
		t.Errorf("b = 1.2 a exactly: CI %.4f-%.4f ok=%v, want a point at 1.2", lo, hi, ok)
	}
	small, big := [2]float64{}, [2]float64{}
	a, b = noisy(20, 1.1)
	small[0], small[1], _ = RatioCI(a, b)
	a, b = noisy(400, 1.1)
	big[0], big[1], _ = RatioCI(a, b)
	if big[1]-big[0] >= small[1]-small[0] {
		t.Errorf("CI from 400 pairs %.3f-%.3f is not narrower than from 20 %.3f-%.3f", big[0], big[1], small[0], small[1])
	}
	if r := Ratio(Summarize(b).Median, Summarize(a).Median); big[0] > r || big[1] < r {
		t.Errorf("CI %.3f-%.3f misses the samples' own ratio %.3f", big[0], big[1], r)
	}
	again := [2]float64{}
	again[0], again[1], _ = RatioCI(a, b)
	if again != big {
		t.Errorf("same samples, different CI: %v then %v", big, again)
	}
}
