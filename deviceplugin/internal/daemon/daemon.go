// Package daemon wires the device plugin together: NVML (real or
// simulated), GPU selection, the CDI spec, health, the DevicePlugin service,
// kubelet registration and the metrics/health endpoints.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/deviceplugin/internal/allocate"
	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/devices"
	"github.com/nvinject/nvinject/deviceplugin/internal/health"
	"github.com/nvinject/nvinject/deviceplugin/internal/kubelet"
	"github.com/nvinject/nvinject/deviceplugin/internal/metrics"
	"github.com/nvinject/nvinject/deviceplugin/internal/plugin"
	"github.com/nvinject/nvinject/deviceplugin/internal/simdebug"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/httpserve"
)

// Daemon is one device plugin process.
type Daemon struct {
	cfg       config.Config
	log       *slog.Logger
	open      func(string, backend.Options) (*backend.Backend, error)
	recover   <-chan struct{}
	poll      time.Duration
	grace     time.Duration
	nvmlRetry time.Duration

	notReady atomic.Pointer[string]
	tracker  atomic.Pointer[health.Tracker]
	sim      atomic.Pointer[backend.Backend]
}

// Option configures a Daemon.
type Option func(*Daemon)

// WithRecoverAll marks every GPU Healthy again on each receive (SIGHUP).
func WithRecoverAll(ch <-chan struct{}) Option { return func(d *Daemon) { d.recover = ch } }

// WithOpen replaces how NVML is opened (tests keep the simulated node).
func WithOpen(f func(string, backend.Options) (*backend.Backend, error)) Option {
	return func(d *Daemon) { d.open = f }
}

// WithTimings shortens the socket poll, the health start grace and the
// NVML retry interval (tests).
func WithTimings(poll, grace, nvmlRetry time.Duration) Option {
	return func(d *Daemon) { d.poll, d.grace, d.nvmlRetry = poll, grace, nvmlRetry }
}

// New returns a daemon for cfg.
func New(cfg config.Config, log *slog.Logger, opts ...Option) *Daemon {
	d := &Daemon{cfg: cfg, log: log, open: backend.Open, poll: 100 * time.Millisecond, grace: 500 * time.Millisecond, nvmlRetry: 10 * time.Second}
	for _, o := range opts {
		o(d)
	}
	d.setNotReady("starting")
	return d
}

func (d *Daemon) setNotReady(why string) { d.notReady.Store(&why) }

// Ready is nil once the plugin is registered with kubelet, else why not.
func (d *Daemon) Ready() error {
	if p := d.notReady.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}

// Run runs until ctx ends. It returns an error when the plugin cannot
// start: bad GPU selection, CDI spec failure, NVML missing with
// --on-nvml-error=exit, or the metrics address taken.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	httpErr := make(chan error, 1)
	web := httpserve.New(d.cfg.MetricsAddr, reg, httpserve.WithLogger(d.log), httpserve.WithReady(d.Ready))
	if d.cfg.NVML != backend.Real {
		for pattern, h := range simdebug.Routes(simInjector{d}, trackerRecoverer{d}) {
			web.Handle(pattern, h)
		}
	}
	go func() { httpErr <- web.Run(ctx) }()

	b, err := d.openNVML(ctx, httpErr)
	if err != nil || b == nil {
		return err
	}
	defer b.Close()
	if b.Sim != nil {
		d.sim.Store(b)
	}

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
	d.setNotReady("not registered with kubelet yet (waiting for " + d.cfg.KubeletSocket() + ")")

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

	tracker := health.New(uuidsOf(published),
		health.WithLogger(d.log), health.WithIgnoredXids(d.cfg.IgnoredXids), health.WithQuietPeriod(d.cfg.QuietPeriod),
		health.WithStartGrace(d.grace), health.WithObserver(m.ObserveEvent),
		health.WithOnChange(func(st []health.State) {
			for _, s := range st {
				if id, ok := idOf[s.UUID]; ok {
					m.SetHealthy(s.UUID, id, s.Healthy)
				}
			}
		}))
	d.tracker.Store(tracker)
	go tracker.Run(ctx, b)
	go d.recoverOnSignal(ctx, tracker)

	svc := plugin.New(table, tracker, resp, m, d.log)
	registrar := kubelet.New(d.cfg.KubeletDir, d.cfg.PluginSocket, d.cfg.ResourceName, svc,
		kubelet.WithLogger(d.log), kubelet.WithPoll(d.poll), kubelet.WithStopService(svc.Stop),
		kubelet.WithOnRegister(func(err error) {
			if err != nil {
				m.Registrations.WithLabelValues("error").Inc()
				d.setNotReady("not registered with kubelet: " + err.Error())
				return
			}
			m.Registrations.WithLabelValues("ok").Inc()
			d.notReady.Store(nil)
		}))
	regDone := make(chan error, 1)
	go func() { regDone <- registrar.Run(ctx) }()
	select {
	case err := <-httpErr:
		cancel()
		<-regDone
		return err
	case err := <-regDone:
		return err
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

// openNVML opens the backend; on failure it exits or waits as configured.
// A nil backend with a nil error means ctx ended while waiting.
func (d *Daemon) openNVML(ctx context.Context, httpErr <-chan error) (*backend.Backend, error) {
	for {
		b, err := d.open(d.cfg.NVML, backend.Options{DriverRoot: d.cfg.DriverRoot})
		if err == nil {
			return b, nil
		}
		err = fmt.Errorf("cannot open NVML (--nvml=%s): %w", d.cfg.NVML, err)
		if d.cfg.OnNVMLError == config.OnNVMLErrorExit {
			return nil, err
		}
		d.setNotReady(err.Error())
		d.log.Error("NVML unavailable; no GPUs published, retrying (set --on-nvml-error=exit to fail instead)", "err", err, "retry_in", d.nvmlRetry)
		select {
		case <-ctx.Done():
			return nil, nil
		case err := <-httpErr:
			return nil, err
		case <-time.After(d.nvmlRetry):
		}
	}
}

func (d *Daemon) recoverOnSignal(ctx context.Context, t *health.Tracker) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.recover:
			d.log.Info("operator recovery: marking every GPU's Xid and loss cleared")
			t.RecoverAll()
		}
	}
}

type simInjector struct{ d *Daemon }

func (s simInjector) InjectXid(uuid string, xid uint64) error {
	b := s.d.sim.Load()
	if b == nil {
		return errors.New("the simulated node is not open yet")
	}
	return b.Sim.InjectXid(uuid, xid)
}

type trackerRecoverer struct{ d *Daemon }

func (r trackerRecoverer) Recover(uuid string) error {
	t := r.d.tracker.Load()
	if t == nil {
		return errors.New("health tracking has not started yet")
	}
	return t.Recover(uuid)
}
