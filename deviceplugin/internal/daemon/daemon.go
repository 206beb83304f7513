// Package daemon wires the device plugin protocol onto the GPU node
// (gpunode: NVML, selection, the one CDI spec, health, the metrics and
// health endpoints): the device table, the GPUs DRA claims hold
// (gpunode/nodemove), the DevicePlugin service and kubelet registration,
// which waits for health monitoring.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/nvinject/nvinject/deviceplugin/internal/allocate"
	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/devices"
	"github.com/nvinject/nvinject/deviceplugin/internal/kubelet"
	"github.com/nvinject/nvinject/deviceplugin/internal/metrics"
	"github.com/nvinject/nvinject/deviceplugin/internal/plugin"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/gpunode/nodemove"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/httpserve"
)

// Daemon is one device plugin process.
type Daemon struct {
	cfg          config.Config
	log          *slog.Logger
	poll         time.Duration
	startTimeout time.Duration
	nodeOpts     []gpunode.Option
	id           devices.IDFunc

	node  *gpunode.Node
	ready *httpserve.Readiness
	held  atomic.Pointer[nodemove.Set]
}

// Option configures a Daemon.
type Option func(*Daemon)

// WithNode configures the GPU node under the plugin (gpunode.WithOpen,
// WithRecoverSignal, WithNVMLRetry).
func WithNode(opts ...gpunode.Option) Option {
	return func(d *Daemon) { d.nodeOpts = append(d.nodeOpts, opts...) }
}

// WithTimings sets the registrar's fallback poll and how long registration
// waits for health monitoring to arm before it publishes every GPU
// Unhealthy (tests shorten them).
func WithTimings(poll, startTimeout time.Duration) Option {
	return func(d *Daemon) { d.poll, d.startTimeout = poll, startTimeout }
}

// New returns a daemon for cfg.
func New(cfg config.Config, log *slog.Logger, opts ...Option) *Daemon {
	d := &Daemon{cfg: cfg, log: log, ready: httpserve.NewReadiness("starting"), poll: time.Second, startTimeout: 10 * time.Second, id: devices.ByUUID}
	for _, o := range opts {
		o(d)
	}
	if cfg.IDStrategy == config.IDIndex {
		d.id = devices.ByIndex
	}
	d.node = gpunode.New(cfg.Config, log, append([]gpunode.Option{
		gpunode.WithReady(d.protocolReady),
		gpunode.WithHealthMetrics(gpunode.HealthMetrics{
			Events: contract.MetricHealthEvents, Healthy: contract.MetricDeviceHealthy,
			HealthyHelp: "1 when the published GPU is Healthy, 0 when Unhealthy.", DeviceLabel: "device_id", DeviceID: d.id,
		}),
	}, d.nodeOpts...)...)
	return d
}

// Ready is nil once NVML is open, the plugin is registered with kubelet
// and it can tell which GPUs DRA claims hold, else why not.
func (d *Daemon) Ready() error { return d.node.Ready() }

func (d *Daemon) protocolReady() error {
	if err := d.ready.Ready(); err != nil {
		return err
	}
	if h := d.held.Load(); h != nil {
		if err := h.Err(); err != nil {
			return fmt.Errorf("every GPU withheld (published Unhealthy): %w", err)
		}
	}
	return nil
}

// Run runs until ctx ends. It returns an error when the plugin cannot
// start (gpunode.Node.Run says when). Every goroutine it starts has ended
// when it returns, and NVML is closed only after the health watch and
// everything else that uses it stopped.
func (d *Daemon) Run(ctx context.Context) error {
	m := metrics.New(d.node.Registry())
	return d.node.Run(ctx, func(ctx context.Context, g gpunode.GPUs) error { return d.serve(ctx, g, m) })
}

// serve publishes the node's GPUs to kubelet: the PodResources poll and
// kubelet registration run until ctx ends or one of them fails; it returns
// after all of them did.
func (d *Daemon) serve(ctx context.Context, gpus gpunode.GPUs, m *metrics.Metrics) error {
	published := gpus.Published
	table, err := devices.New(gpus.Node, published, d.id, gpus.CDIName)
	if err != nil {
		return err
	}
	resp, err := d.responder()
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(published))
	for _, e := range table.Entries() {
		ids = append(ids, e.ID)
		d.log.Info("publishing GPU", "id", e.ID, "uuid", e.Device.UUID, "name", e.Device.Name, "numa", e.Device.NUMANode, "cdi_device", e.CDIName)
	}
	if err := resp.Check(ids); err != nil {
		return err
	}

	var (
		svcOpts []plugin.Option
		follow  func(context.Context)
		// firstHeld is closed once PodResources was first read; nil without it.
		firstHeld <-chan struct{}
	)
	if d.cfg.PodResourcesSocket != "" {
		src := nodemove.DRAClaims(contract.DRADriver)
		w, err := nodemove.Dial(d.cfg.PodResourcesSocket, src, published)
		if err != nil {
			return err
		}
		held := nodemove.NewSet(src, gpus.UUIDs(), d.log, m.SetHeld)
		d.held.Store(held)
		svcOpts = append(svcOpts, plugin.WithWithheld(held))
		follow = func(ctx context.Context) { w.Follow(ctx, held) }
		firstHeld = held.Read()
	} else {
		d.log.Warn("--pod-resources-socket is empty: GPUs held by DRA pods are not protected; a device-plugin pod may get a GPU a DRA claim still uses (a node moved back from DRA under running pods)")
	}
	svc := plugin.New(table, gpus.Health, resp, m, d.log, svcOpts...)
	registrar := kubelet.New(d.cfg.KubeletDir, d.cfg.PluginSocket, d.cfg.ResourceName, svc,
		kubelet.WithLogger(d.log), kubelet.WithPoll(d.poll), kubelet.WithStopService(svc.Stop),
		kubelet.WithOnRegister(func(err error) {
			if err != nil {
				m.Registrations.WithLabelValues("error").Inc()
				d.ready.SetNotReady("not registered with kubelet: " + err.Error())
				return
			}
			m.Registrations.WithLabelValues("ok").Inc()
			d.ready.SetReady()
		}))

	g, ctx := errgroup.WithContext(ctx)
	if follow != nil {
		g.Go(func() error { follow(ctx); return nil })
	}
	g.Go(func() error {
		if !d.awaitMonitoring(ctx, gpus.Health) {
			return nil
		}
		// kubelet's first list already withholds what DRA claims hold.
		if firstHeld != nil {
			select {
			case <-firstHeld:
			case <-ctx.Done():
				return nil
			}
		}
		d.ready.SetNotReady("not registered with kubelet yet (waiting for " + d.cfg.KubeletSocket() + ")")
		return registrar.Run(ctx)
	})
	return g.Wait()
}

// awaitMonitoring holds registration until health monitoring is armed and
// NVML checked every GPU, so kubelet's first list is the true one. If it
// does not arm within the start timeout the plugin registers anyway, every
// GPU Unhealthy with the reason, rather than stay invisible. It returns
// false when ctx ended first.
func (d *Daemon) awaitMonitoring(ctx context.Context, t *health.Tracker) bool {
	d.ready.SetNotReady("waiting for health monitoring to start")
	timeout := time.NewTimer(d.startTimeout)
	defer timeout.Stop()
	select {
	case <-t.Monitored():
		return true
	case <-timeout.C:
		d.log.Error("health monitoring did not start; registering with every GPU Unhealthy until it does", "waited", d.startTimeout, "reason", t.States()[0].Reason)
		return true
	case <-ctx.Done():
		return false
	}
}

func (d *Daemon) responder() (*allocate.Responder, error) {
	return allocate.New(d.cfg.AnnotationPrefix, d.cfg.Strategies...)
}
