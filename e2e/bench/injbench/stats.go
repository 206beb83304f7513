package injbench

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Summary describes one set of timings.
type Summary struct {
	N      int
	Median time.Duration
	P90    time.Duration
	Min    time.Duration
	Max    time.Duration
}

// Summarize returns the median, the nearest-rank 90th percentile, min and
// max of ds; the zero Summary when ds is empty.
func Summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return Summary{N: len(s), Median: median(s), P90: nearestRank(s, 0.90), Min: s[0], Max: s[len(s)-1]}
}

// median of sorted s: the mean of the two middle values when len(s) is even.
func median(s []time.Duration) time.Duration {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// nearestRank is the smallest value with at least q of the samples at or
// below it, so it is always one of the measured values.
func nearestRank(s []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(i, 0)]
}

// Ratio is b/a, or 0 when a is zero.
func Ratio(b, a time.Duration) float64 {
	if a == 0 {
		return 0
	}
	return float64(b) / float64(a)
}

// RatioCI is a 95 % confidence interval for median(b)/median(a) over
// paired samples (a[i], b[i] from the same iteration): a percentile
// bootstrap that resamples whole pairs, so the drift of a busy host that
// both paths of an iteration share stays paired. The generator is seeded
// from the samples, so a report reproduces from its data. ok is false
// with fewer than 10 pairs, where the interval would mean little.
func RatioCI(a, b []time.Duration) (lo, hi float64, ok bool) {
	n := min(len(a), len(b))
	if n < 10 {
		return 0, 0, false
	}
	var seed uint64
	for i := range n {
		seed = seed*31 + uint64(a[i]) ^ uint64(b[i])
	}
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	const resamples = 2000
	ratios := make([]float64, resamples)
	ra, rb := make([]time.Duration, n), make([]time.Duration, n)
	for r := range ratios {
		for i := range n {
			j := rng.IntN(n)
			ra[i], rb[i] = a[j], b[j]
		}
		slices.Sort(ra)
		slices.Sort(rb)
		ratios[r] = Ratio(median(rb), median(ra))
	}
	slices.Sort(ratios)
	return ratios[int(0.025*resamples)], ratios[int(0.975*resamples)-1], true
}
