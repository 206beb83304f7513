// Package daemon wires the device plugin together: NVML (real or
// simulated), GPU selection, the CDI spec, health, the GPUs DRA claims hold
// (kubelet's PodResources), the DevicePlugin service, kubelet registration
// and the metrics/health endpoints.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/deviceplugin/internal/allocate"
	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/devices"
	"github.com/nvinject/nvinject/deviceplugin/internal/kubelet"
	"github.com/nvinject/nvinject/deviceplugin/internal/metrics"
	"github.com/nvinject/nvinject/deviceplugin/internal/plugin"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/gpunode/nodemove"
	"github.com/nvinject/nvinject/gpunode/simdebug"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/httpserve"
)

// Daemon is one device plugin process.
type Daemon struct {
	cfg          config.Config
	log          *slog.Logger
	open         gpunode.OpenFunc
	recover      <-chan os.Signal
	poll         time.Duration
	startTimeout time.Duration
	nvmlRetry    time.Duration

	ready   *httpserve.Readiness
	held    atomic.Pointer[nodemove.Set]
	tracker atomic.Pointer[health.Tracker]
	sim     atomic.Pointer[backend.Backend]
}

// Option configures a Daemon.
type Option func(*Daemon)

// WithRecoverSignal asks NVML about every GPU, and clears the Xid and loss
// marks of those it vouches for, on each receive (SIGHUP).
func WithRecoverSignal(ch <-chan os.Signal) Option { return func(d *Daemon) { d.recover = ch } }

// WithOpen replaces how NVML is opened (tests keep the simulated node).
func WithOpen(f gpunode.OpenFunc) Option {
	return func(d *Daemon) { d.open = f }
}

// WithTimings sets the registrar's fallback poll, how long registration
// waits for health monitoring to arm before it publishes every GPU
// Unhealthy, and the NVML retry interval (tests shorten them).
func WithTimings(poll, startTimeout, nvmlRetry time.Duration) Option {
	return func(d *Daemon) { d.poll, d.startTimeout, d.nvmlRetry = poll, startTimeout, nvmlRetry }
}

// checkpointFile is the health checkpoint's name in --state-dir.
const checkpointFile = "health.json"

// New returns a daemon for cfg.
func New(cfg config.Config, log *slog.Logger, opts ...Option) *Daemon {
	d := &Daemon{cfg: cfg, log: log, ready: httpserve.NewReadiness("starting"), open: backend.Open, poll: time.Second, startTimeout: 10 * time.Second, nvmlRetry: 10 * time.Second}
	for _, o := range opts {
		o(d)
	}
	return d
}

// Ready is nil once the plugin is registered with kubelet and can tell
// which GPUs DRA claims hold, else why not.
func (d *Daemon) Ready() error {
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
// start: bad GPU selection, CDI spec failure, NVML missing with
// --on-nvml-error=exit, or the metrics address taken. Every goroutine it
// starts has ended when it returns, and NVML is closed only after the
// health watch and everything else that uses it stopped.
func (d *Daemon) Run(ctx context.Context) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)
	web := httpserve.New(d.cfg.MetricsAddr, reg, httpserve.WithLogger(d.log), httpserve.WithReady(d.Ready))
	if d.cfg.NVML != backend.Real {
		for pattern, h := range simdebug.Routes(d.late(), d.late()) {
			web.Handle(pattern, h)
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return web.Run(ctx) })
	g.Go(func() error { return d.serveNVML(ctx, m) })
	return g.Wait()
}

// serveNVML opens NVML, publishes, and closes NVML once publishing ended.
func (d *Daemon) serveNVML(ctx context.Context, m *metrics.Metrics) error {
	b, err := gpunode.OpenNVML(ctx, d.cfg.Config, d.open, d.nvmlRetry, d.log, d.ready.SetNotReady)
	if err != nil || b == nil {
		return err
	}
	if b.Sim != nil {
		d.sim.Store(b)
	}
	err = d.publish(ctx, b, m)
	if cerr := b.Close(); cerr != nil {
		d.log.Warn("closing NVML failed", "error", cerr)
	}
	return err
}

// publish discovers the GPUs, writes their CDI spec, and runs health
// tracking, operator recovery, the PodResources poll and kubelet
// registration until ctx ends or one of them fails; it returns after all
// of them did.
func (d *Daemon) publish(ctx context.Context, b *backend.Backend, m *metrics.Metrics) error {
	node, err := b.Discover(ctx)
	if err != nil {
		return fmt.Errorf("discover GPUs: %w", err)
	}
	published, skipped, err := gpuselect.Select(node.Devices, d.cfg.Selector, d.cfg.MIGStrategy)
	if err != nil {
		return err
	}
	for _, s := range skipped {
		d.log.Warn("GPU not published", "uuid", s.Device.UUID, "reason", s.Reason)
	}
	if len(published) == 0 {
		return fmt.Errorf("no GPU to publish: NVIDIA_VISIBLE_DEVICES=%q selects none of the node's %d GPUs; set it (ConfigMap key selected-gpu-uuid) to a GPU UUID, index or all", d.cfg.VisibleDevices, len(node.Devices))
	}

	gen := spec.New(spec.WithVendor(d.cfg.CDIVendor), spec.WithClass(d.cfg.CDIClass), spec.WithDriverRoot(d.cfg.DriverRoot), spec.WithHostDriverRoot(d.cfg.HostDriverRoot), spec.WithHookBinary(d.cfg.HookBinary))
	s, err := gen.Generate(node, published)
	if err != nil {
		return fmt.Errorf("generate the CDI spec: %w", err)
	}
	path, changed, err := spec.Write(d.cfg.CDISpecDir, s)
	if err != nil {
		return fmt.Errorf("write the CDI spec: %w; check that --cdi-spec-dir is writable", err)
	}
	d.log.Info("CDI spec ready", "path", path, "rewritten", changed, "gpus", len(published))

	idFn := devices.ByUUID
	if d.cfg.IDStrategy == config.IDIndex {
		idFn = devices.ByIndex
	}
	table, err := devices.New(node, published, idFn, gen.QualifiedName)
	if err != nil {
		return err
	}
	resp, err := d.responder()
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(published))
	idOf := map[string]string{}
	for _, e := range table.Entries() {
		ids = append(ids, e.ID)
		idOf[e.Device.UUID] = e.ID
		d.log.Info("publishing GPU", "id", e.ID, "uuid", e.Device.UUID, "name", e.Device.Name, "numa", e.Device.NUMANode, "cdi_device", e.CDIName)
	}
	if err := resp.Check(ids); err != nil {
		return err
	}

	opts := []health.Option{
		health.WithLogger(d.log), health.WithIgnoredXids(d.cfg.IgnoredXids), health.WithQuietPeriod(d.cfg.QuietPeriod),
		health.WithObserver(m.ObserveEvent),
		health.WithOnChange(func(st []health.State) {
			for _, s := range st {
				if id, ok := idOf[s.UUID]; ok {
					m.SetHealthy(s.UUID, id, s.Healthy)
				}
			}
		}),
	}
	if d.cfg.StateDir != "" {
		opts = append(opts, health.WithCheckpoint(filepath.Join(d.cfg.StateDir, checkpointFile)))
	}
	tracker := health.New(uuidsOf(published), opts...)
	d.tracker.Store(tracker)

	var (
		svcOpts []plugin.Option
		held    *nodemove.Set
		watcher *nodemove.Watcher
	)
	if d.cfg.PodResourcesSocket != "" {
		if watcher, err = nodemove.Dial(d.cfg.PodResourcesSocket, nodemove.DRAClaims(contract.DRADriver), published); err != nil {
			return err
		}
		held = nodemove.NewSet(uuidsOf(published), d.log, m.SetHeld)
		d.held.Store(held)
		svcOpts = append(svcOpts, plugin.WithWithheld(held))
	} else {
		d.log.Warn("--pod-resources-socket is empty: GPUs held by DRA pods are not protected; a device-plugin pod may get a GPU a DRA claim still uses (a node moved back from DRA under running pods)")
	}
	svc := plugin.New(table, tracker, resp, m, d.log, svcOpts...)
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
	g.Go(func() error { tracker.Run(ctx, b); return nil })
	g.Go(func() error { d.recoverOnSignal(ctx, tracker); return nil })
	firstHeld := make(chan struct{})
	if held == nil {
		close(firstHeld)
	} else {
		g.Go(func() error {
			defer watcher.Close()
			var r nodemove.Result
			r.Holders, r.Err = watcher.Poll(ctx)
			held.Update(r)
			close(firstHeld)
			watcher.Run(ctx, r, held.Update)
			return nil
		})
	}
	g.Go(func() error {
		if !d.awaitMonitoring(ctx, tracker) {
			return nil
		}
		// kubelet's first list already withholds what DRA claims hold.
		select {
		case <-firstHeld:
		case <-ctx.Done():
			return nil
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

func uuidsOf(devs []gpu.Device) []string {
	out := make([]string, len(devs))
	for i, dv := range devs {
		out[i] = dv.UUID
	}
	return out
}

func (d *Daemon) responder() (*allocate.Responder, error) {
	return allocate.New(d.cfg.AnnotationPrefix, d.cfg.Strategies...)
}

func (d *Daemon) recoverOnSignal(ctx context.Context, t *health.Tracker) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.recover:
			d.log.Info("operator recovery: asking NVML about every GPU before clearing its Xid and loss marks")
			if err := t.RecoverAll(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("operator recovery: NVML does not vouch for some GPUs; they stay Unhealthy", "error", err)
			}
		}
	}
}

// late serves the sim-only endpoints before the node and tracker are open.
func (d *Daemon) late() simdebug.Late { return simdebug.Late{Node: &d.sim, Tracker: &d.tracker} }
