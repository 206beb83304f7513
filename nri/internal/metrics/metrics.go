// Package metrics holds the NRI plugin's Prometheus metrics.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvinject/nvinject/shared/contract"
)

// Metrics are registered on one registry.
type Metrics struct {
	injections prometheus.Counter
	refusals   *prometheus.CounterVec
	latency    prometheus.Histogram
	connected  prometheus.Gauge
	running    *prometheus.GaugeVec
	audit      *prometheus.CounterVec
	auditOn    prometheus.Gauge
}

// New registers the metrics on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		injections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: contract.MetricNRIInjections, Help: "GPU containers that passed the UUID check of the final container.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: contract.MetricNRIRefusals, Help: "Container creations refused, by reason.",
		}, []string{"reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: contract.MetricNRICreate, Help: "CreateContainer handler latency.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: contract.MetricNRIConnected, Help: "1 while registered with the runtime's NRI.",
		}),
		running: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: contract.MetricNRIRunningGPUs, Help: "GPU containers found at the last Synchronize, by check result.",
		}, []string{"check"}),
		audit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: contract.MetricNRIAuditEvents, Help: "Audit Events on GPU containers' pods, by outcome (sent, queue-full, rate-limited, failed).",
		}, []string{"outcome"}),
		auditOn: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: contract.MetricNRIAuditEnabled, Help: "1 while audit Events are recorded through the API server, 0 without an API client.",
		}),
	}
	// Every outcome shows from the start, at 0: none dropped is an answer.
	for _, o := range []string{contract.AuditSent, contract.AuditQueueFull, contract.AuditRateLimited, contract.AuditFailed} {
		m.audit.WithLabelValues(o)
	}
	reg.MustRegister(m.injections, m.refusals, m.latency, m.connected, m.running, m.audit, m.auditOn)
	return m
}

// Injected counts a container that got its GPUs.
func (m *Metrics) Injected() { m.injections.Inc() }

// Refused counts a refused creation.
func (m *Metrics) Refused(reason string) { m.refusals.WithLabelValues(reason).Inc() }

// Observe records one handler call's duration.
func (m *Metrics) Observe(d time.Duration) { m.latency.Observe(d.Seconds()) }

// Connected records the NRI connection state.
func (m *Metrics) Connected(up bool) {
	if up {
		m.connected.Set(1)
		return
	}
	m.connected.Set(0)
}

// Running records the Synchronize census.
func (m *Metrics) Running(pass, fail int) {
	m.running.WithLabelValues("pass").Set(float64(pass))
	m.running.WithLabelValues("fail").Set(float64(fail))
}

// AuditEvent counts one audit record's outcome (a contract.Audit* value).
func (m *Metrics) AuditEvent(outcome string) { m.audit.WithLabelValues(outcome).Inc() }

// AuditEnabled records whether audit Events have an API client.
func (m *Metrics) AuditEnabled(on bool) {
	if on {
		m.auditOn.Set(1)
		return
	}
	m.auditOn.Set(0)
}
