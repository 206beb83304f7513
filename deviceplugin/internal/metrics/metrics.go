// Package metrics defines the device plugin's Prometheus metrics.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvinject/nvinject/gpunode/nodemove"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// Metrics are the plugin's collectors.
type Metrics struct {
	Registrations *prometheus.CounterVec
	Allocations   *prometheus.CounterVec
	ActiveStreams prometheus.Gauge
	HealthEvents  *prometheus.CounterVec
	DeviceHealthy *prometheus.GaugeVec
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
		HealthEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nvinject_device_plugin_health_events_total",
			Help: "NVML health events received, by kind (xid, gpu-lost), Xid and whether policy ignored them.",
		}, []string{"kind", "xid", "ignored"}),
		DeviceHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nvinject_device_plugin_device_healthy",
			Help: "1 when the published GPU is Healthy, 0 when Unhealthy.",
		}, []string{"uuid", "device_id"}),
		GPUHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: contract.MetricGPUHeld,
			Help: "1 per GPU published Unhealthy because another path holds it, not for its health: holder " + contract.HeldByDRAClaim + " (pod, claim) or " + contract.HeldUnknown + " (kubelet's PodResources cannot be read: every GPU).",
		}, []string{"uuid", "holder", "pod", "claim"}),
	}
	reg.MustRegister(m.Registrations, m.Allocations, m.ActiveStreams, m.HealthEvents, m.DeviceHealthy, m.GPUHeld)
	return m
}

// ObserveEvent counts one health event.
func (m *Metrics) ObserveEvent(e gpu.HealthEvent, ignored bool) {
	xid := ""
	if e.Kind == gpu.EventXid {
		xid = strconv.FormatUint(e.Xid, 10)
	}
	m.HealthEvents.WithLabelValues(e.Kind.String(), xid, strconv.FormatBool(ignored)).Inc()
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

// SetHealthy records one GPU's health.
func (m *Metrics) SetHealthy(uuid, id string, healthy bool) {
	v := 0.0
	if healthy {
		v = 1
	}
	m.DeviceHealthy.WithLabelValues(uuid, id).Set(v)
}
