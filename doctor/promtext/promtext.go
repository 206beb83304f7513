// Package promtext fetches and reads a Prometheus text exposition (the
// daemons' /metrics) into plain samples.
package promtext

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one series' value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Families maps metric names to their samples.
type Families map[string][]Sample

// Parse reads the text format.
func Parse(r io.Reader) (Families, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse Prometheus text: %w", err)
	}
	out := make(Families, len(mfs))
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := make(map[string]string, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out[name] = append(out[name], Sample{Labels: labels, Value: value(m)})
		}
	}
	return out, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetUntyped() != nil:
		return m.GetUntyped().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	case m.GetSummary() != nil:
		return float64(m.GetSummary().GetSampleCount())
	}
	return 0
}

// Sum returns the sum of name's samples, or nil when the metric is absent.
func (f Families) Sum(name string) *float64 {
	s, ok := f[name]
	if !ok {
		return nil
	}
	var total float64
	for _, x := range s {
		total += x.Value
	}
	return &total
}

// SumWhere returns the sum of name's samples whose label equals value, or
// nil when the metric is absent.
func (f Families) SumWhere(name, label, value string) *float64 {
	s, ok := f[name]
	if !ok {
		return nil
	}
	var total float64
	for _, x := range s {
		if x.Labels[label] == value {
			total += x.Value
		}
	}
	return &total
}

// Fetch GETs url and parses the answer.
func Fetch(ctx context.Context, c *http.Client, url string) (Families, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("metrics URL %q: %w", url, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s (is the daemon running and its metrics port reachable from here?): %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	f, err := Parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return f, nil
}
