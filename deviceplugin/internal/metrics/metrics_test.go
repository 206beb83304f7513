package metrics

import (
	"errors"
	"maps"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvinject/nvinject/gpunode/nodemove"
	"github.com/nvinject/nvinject/shared/contract"
)

// held reads the gpu_held series as "uuid holder pod claim" → value.
func held(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != contract.MetricGPUHeld {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["uuid"]+" "+l["holder"]+" "+l["pod"]+" "+l["claim"]] = m.GetGauge().GetValue()
		}
	}
	return out
}

// TestSetHeld: one series per DRA holder, every GPU "unknown" while
// PodResources cannot be read, and no stale series after a change.
func TestSetHeld(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	uuids := []string{"GPU-a", "GPU-b"}
	m.SetHeld(uuids, nodemove.Result{Holders: nodemove.Holders{"GPU-b": {{Pod: "default/vllm", Container: "main", Claim: "default/vllm-gpu"}, {Pod: "default/vllm", Container: "side", Claim: "default/vllm-gpu"}}}})
	if got, want := held(t, reg), map[string]float64{"GPU-b dra-claim default/vllm default/vllm-gpu": 1}; !maps.Equal(got, want) {
		t.Errorf("held by a claim: %v, want %v", got, want)
	}
	m.SetHeld(uuids, nodemove.Result{Err: errors.New("connection refused")})
	if got, want := held(t, reg), map[string]float64{"GPU-a unknown  ": 1, "GPU-b unknown  ": 1}; !maps.Equal(got, want) {
		t.Errorf("PodResources unreadable: %v, want %v", got, want)
	}
	m.SetHeld(uuids, nodemove.Result{Holders: nodemove.Holders{}})
	if got := held(t, reg); len(got) != 0 {
		t.Errorf("nothing held: %v", got)
	}
}
