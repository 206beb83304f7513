// Package metrics defines the device plugin's own Prometheus metrics; the
// GPU node (gpunode) keeps the health ones.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvinject/nvinject/gpunode/nodemove"
	"github.com/nvinject/nvinject/shared/contract"
)

// Metrics are the plugin's collectors.
type Metrics struct {
	Registrations *prometheus.CounterVec
	Allocations   *prometheus.CounterVec
	ActiveStreams prometheus.Gauge
	GPUHeld       *prometheus.GaugeVec
}

// New registers the metrics with reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvinject_device_plugin_registrations_total",
			Help: "Register calls to kubelet, by result (ok, error).",
		}, []string{"result"}),
		Allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvinject_device_plugin_allocations_total",
			Help: "Allocate requests per container, by result (ok, refused).",
		}, []string{"result"}),
		ActiveStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nvinject_device_plugin_list_and_watch_streams",
			Help: "Open ListAndWatch streams.",
		}),
		GPUHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: contract.MetricGPUHeld,
			Help: "1 per GPU published Unhealthy because another path holds it, not for its health: holder " + contract.HeldByDRAClaim + " (pod, claim) or " + contract.HeldUnknown + " (kubelet's PodResources cannot be read: every GPU).",
		}, []string{"uuid", "holder", "pod", "claim"}),
	}
	reg.MustRegister(m.Registrations, m.Allocations, m.ActiveStreams, m.GPUHeld)
	return m
}

// SetHeld records which of the published GPUs uuids are withheld, and by whom.
func (m *Metrics) SetHeld(uuids []string, r nodemove.Result) {
	m.GPUHeld.Reset()
	for _, u := range uuids {
		if r.Err != nil {
			m.GPUHeld.WithLabelValues(u, contract.HeldUnknown, "", "").Set(1)
			continue
		}
		for _, h := range r.Holders[u] {
			m.GPUHeld.WithLabelValues(u, contract.HeldByDRAClaim, h.Pod, h.Claim).Set(1)
		}
	}
}
