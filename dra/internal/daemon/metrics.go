package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvinject/nvinject/shared/contract"
)

// metrics are nvinject-dra's own collectors (the node keeps the health
// ones); they implement driver.Metrics.
type metrics struct {
	prepares, unprepares *prometheus.CounterVec
	prepared             prometheus.Gauge
	streams              prometheus.Gauge
	background           prometheus.Counter
	registered           prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		prepares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: contract.MetricDRAPrepares, Help: "Claims answered in NodePrepareResources, by result (ok, error).",
		}, []string{"result"}),
		unprepares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: contract.MetricDRAUnprepares, Help: "Claims answered in NodeUnprepareResources, by result (ok, not-prepared, error).",
		}, []string{"result"}),
		prepared: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: contract.MetricDRAPrepared, Help: "Claims prepared on this node (the checkpoint's entries).",
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: contract.MetricDRAHealthStreams, Help: "Open KEP-4680 NodeWatchResources streams from kubelet.",
		}),
		background: prometheus.NewCounter(prometheus.CounterOpts{
			Name: contract.MetricDRABackgroundErrors, Help: "Background errors (ResourceSlice publication, gRPC servers).",
		}),
		registered: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: contract.MetricDRARegistered, Help: "1 once kubelet accepted the plugin's registration.",
		}),
	}
	reg.MustRegister(m.prepares, m.unprepares, m.prepared, m.streams, m.background, m.registered)
	return m
}

func (m *metrics) Prepared(result string)   { m.prepares.WithLabelValues(result).Inc() }
func (m *metrics) Unprepared(result string) { m.unprepares.WithLabelValues(result).Inc() }
func (m *metrics) SetPreparedClaims(n int)  { m.prepared.Set(float64(n)) }
func (m *metrics) HealthStream(delta int)   { m.streams.Add(float64(delta)) }
func (m *metrics) BackgroundError()         { m.background.Inc() }
