package injbench

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Report is the summary of a Result.
type Report struct {
	Runtime     string
	A, B        Summary
	PluginA     Summary
	PluginB     Summary
	Sandbox     Summary
	Remove      Summary
	RatioMedian float64
	RatioP90    float64
	// RatioCI is the 95 % confidence interval of RatioMedian from the
	// paired bootstrap; HasCI is false below 10 pairs.
	RatioCI [2]float64
	HasCI   bool
	// PairedDiff is the median over iterations of b's time minus a's in
	// the same iteration, which cancels drift of a busy host.
	PairedDiff     time.Duration
	ContainersEach int
}

// Summarize reduces the samples to medians, p90s and the b/a ratios.
func (r *Result) Summarize() Report {
	pick := func(key string, f func(Sample) time.Duration) []time.Duration {
		var out []time.Duration
		for _, s := range r.Samples {
			if key == "" || s.Path == key {
				out = append(out, f(s))
			}
		}
		return out
	}
	createStart := func(s Sample) time.Duration { return s.CreateStart }
	plugin := func(s Sample) time.Duration { return s.Plugin }
	rep := Report{
		Runtime: r.Runtime,
		A:       Summarize(pick(pathNative.key, createStart)), B: Summarize(pick(pathNRI.key, createStart)),
		PluginA: Summarize(pick(pathNative.key, plugin)), PluginB: Summarize(pick(pathNRI.key, plugin)),
		Sandbox: Summarize(pick("", func(s Sample) time.Duration { return s.Sandbox })),
		Remove:  Summarize(pick("", func(s Sample) time.Duration { return s.Remove })),
	}
	rep.ContainersEach = rep.A.N
	rep.RatioMedian = Ratio(rep.B.Median, rep.A.Median)
	rep.RatioP90 = Ratio(rep.B.P90, rep.A.P90)
	pa, pb := r.pairs()
	diffs := make([]time.Duration, len(pa))
	for i := range pa {
		diffs[i] = pb[i] - pa[i]
	}
	rep.PairedDiff = Summarize(diffs).Median
	lo, hi, ok := RatioCI(pa, pb)
	rep.RatioCI, rep.HasCI = [2]float64{lo, hi}, ok
	return rep
}

// pairs are the create+start times of the iterations that have both
// paths, a's and b's at the same index, in iteration order.
func (r *Result) pairs() (a, b []time.Duration) {
	at := map[int]time.Duration{}
	for _, s := range r.Samples {
		if s.Path == pathNative.key {
			at[s.Iteration] = s.CreateStart
		}
	}
	for _, s := range r.Samples {
		if x, ok := at[s.Iteration]; ok && s.Path == pathNRI.key {
			a, b = append(a, x), append(b, s.CreateStart)
		}
	}
	return a, b
}

// WriteTable writes the human-readable table.
func (rep Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "GPU container CreateContainer+StartContainer over CRI, %s, %d per path, interleaved ABBA\n", rep.Runtime, rep.ContainersEach)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "path\t\tn\tmedian\tp90\tmin\tmax\tnvinject-nri handler p50")
	row := func(p path, s, plugin Summary) {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", p.key, p.label, s.N, ms(s.Median), ms(s.P90), ms(s.Min), ms(s.Max), us(plugin.Median))
	}
	row(pathNative, rep.A, rep.PluginA)
	row(pathNRI, rep.B, rep.PluginB)
	if err := tw.Flush(); err != nil {
		return err
	}
	ci := "95% CI needs at least 10 pairs"
	if rep.HasCI {
		ci = fmt.Sprintf("95%% CI %.3f-%.3f, paired bootstrap over %d pairs", rep.RatioCI[0], rep.RatioCI[1], rep.ContainersEach)
	}
	fmt.Fprintf(w, "ratio b/a: median %.3f (%s), p90 %.3f; paired median b-a %s\n", rep.RatioMedian, ci, rep.RatioP90, ms(rep.PairedDiff))
	fmt.Fprintf(w, "not timed: RunPodSandbox median %s (p90 %s), pod stop+remove median %s\n", ms(rep.Sandbox.Median), ms(rep.Sandbox.P90), ms(rep.Remove.Median))
	_, err := fmt.Fprintf(w, "design: %s\n", Design)
	return err
}

// jsonPath is one path in the JSON line.
type jsonPath struct {
	N              int     `json:"n"`
	MedianMS       float64 `json:"median_ms"`
	P90MS          float64 `json:"p90_ms"`
	MinMS          float64 `json:"min_ms"`
	MaxMS          float64 `json:"max_ms"`
	PluginMedianMS float64 `json:"nri_plugin_median_ms"`
}

func newJSONPath(s, plugin Summary) jsonPath {
	return jsonPath{N: s.N, MedianMS: msf(s.Median), P90MS: msf(s.P90), MinMS: msf(s.Min), MaxMS: msf(s.Max), PluginMedianMS: msf(plugin.Median)}
}

// JSON is the machine-readable line.
func (rep Report) JSON() ([]byte, error) {
	return json.Marshal(struct {
		Bench           string      `json:"bench"`
		Runtime         string      `json:"runtime"`
		A               jsonPath    `json:"a"`
		B               jsonPath    `json:"b"`
		RatioMedian     float64     `json:"ratio_b_a_median"`
		RatioP90        float64     `json:"ratio_b_a_p90"`
		RatioCI95       *[2]float64 `json:"ratio_b_a_median_ci95,omitempty"`
		PairedDiffMS    float64     `json:"paired_median_b_minus_a_ms"`
		SandboxMedianMS float64     `json:"sandbox_median_ms"`
		RemoveMedianMS  float64     `json:"remove_median_ms"`
		Design          string      `json:"design"`
	}{
		RatioCI95: ci95(rep),
		Bench:     "nvinject-injection", Runtime: rep.Runtime,
		A: newJSONPath(rep.A, rep.PluginA), B: newJSONPath(rep.B, rep.PluginB),
		RatioMedian: round3(rep.RatioMedian), RatioP90: round3(rep.RatioP90), PairedDiffMS: msf(rep.PairedDiff),
		SandboxMedianMS: msf(rep.Sandbox.Median), RemoveMedianMS: msf(rep.Remove.Median), Design: Design,
	})
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", msf(d)) }

func us(d time.Duration) string {
	return fmt.Sprintf("%.0fµs", float64(d.Round(time.Microsecond))/float64(time.Microsecond))
}

// msf is d in milliseconds, rounded to microseconds.
func msf(d time.Duration) float64 {
	return float64(d.Round(time.Microsecond)) / float64(time.Millisecond)
}

func ci95(rep Report) *[2]float64 {
	if !rep.HasCI {
		return nil
	}
	return &[2]float64{round3(rep.RatioCI[0]), round3(rep.RatioCI[1])}
}

func round3(f float64) float64 { return float64(int64(f*1000+0.5)) / 1000 }
