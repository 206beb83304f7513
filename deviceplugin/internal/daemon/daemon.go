// Package daemon wires the device plugin protocol onto the GPU node
// (gpunode: NVML, selection, the one CDI spec, health, the metrics and
// health endpoints): the device table, the GPUs DRA claims hold
// (gpunode/nodemove), the DevicePlugin service and kubelet registration,
// which waits for health monitoring.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/nvinject/nvinject/deviceplugin/internal/allocate"
	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/devices"
	"github.com/nvinject/nvinject/deviceplugin/internal/metrics"
	"github.com/nvinject/nvinject/deviceplugin/internal/plugin"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/gpunode/kubelet"
	"github.com/nvinject/nvinject/gpunode/nodelabels"
	"github.com/nvinject/nvinject/gpunode/nodemove"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
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
	nodes        nodelabels.Nodes
	// err is why the daemon cannot run (its API client), from New.
	err error

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

// WithNodes replaces the API client the node's labels are published
// through (tests); used with --node-labels only.
func WithNodes(n nodelabels.Nodes) Option { return func(d *Daemon) { d.nodes = n } }

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
	var labels []gpunode.Option
	if cfg.NodeLabels {
		if d.nodes == nil {
			if d.nodes, d.err = nodelabels.Client(cfg.Kubeconfig, cfg.InCluster, config.Name); d.err != nil {
				d.err = fmt.Errorf("--node-labels publishes the GPU labels through the API server: %w; or set --node-labels=false, and the plugin needs no API access", d.err)
			}
		}
		labels = append(labels, gpunode.WithNodeLabels(d.nodes, contract.MetricLabelApplies))
	}
	d.node = gpunode.New(cfg.Config, log, append(append([]gpunode.Option{
		gpunode.WithReady(d.protocolReady), gpunode.WithSharing(cfg.Sharing),
		gpunode.WithHealthMetrics(gpunode.HealthMetrics{
			Events: contract.MetricHealthEvents, Healthy: contract.MetricDeviceHealthy,
			HealthyHelp: "1 when the published GPU is Healthy, 0 when Unhealthy.", DeviceLabel: "device_id", DeviceID: func(g gpu.Device) string { return d.id(gpuselect.Unit{GPU: g}) },
			Coalesced: contract.MetricHealthCoalesced,
		}),
		gpunode.WithRepublishMetric(contract.MetricRepublishes),
	}, labels...), d.nodeOpts...)...)
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
	if d.err != nil {
		return d.err
	}
	m := metrics.New(d.node.Registry())
	return d.node.Run(ctx, func(ctx context.Context, g gpunode.GPUs) error { return d.serve(ctx, g, m) })
}

// serve publishes the node's GPUs to kubelet: one DevicePlugin service
// and registration per resource (nvidia.com/gpu, and under
// MIG_STRATEGY=mixed each nvidia.com/mig-<profile>), each shared resource
// as its replicas, and the PodResources poll; all run until ctx ends or
// one of them fails, and it returns after all of them did.
func (d *Daemon) serve(ctx context.Context, gpus gpunode.GPUs, m *metrics.Metrics) error {
	published := gpus.Published
	resources, err := gpuselect.Resources(published, d.cfg.MIGStrategy, d.cfg.ResourceName)
	if err != nil {
		return err
	}
	resp, err := d.responder()
	if err != nil {
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

	var served []served
	for _, r := range resources {
		if len(r.Units) == 0 {
			continue
		}
		sv, err := d.resource(gpus, r, resp, m, svcOpts)
		if err != nil {
			return err
		}
		served = append(served, sv)
	}
	reg := newRegistrations(served, d.ready)

	g, ctx := errgroup.WithContext(ctx)
	if follow != nil {
		g.Go(func() error { follow(ctx); return nil })
	}
	g.Go(func() error {
		if !d.awaitMonitoring(ctx, gpus) {
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
		reg.waiting(d.cfg.KubeletSocket())
		rg, ctx := errgroup.WithContext(ctx)
		for _, sv := range served {
			r := kubelet.New(d.cfg.KubeletDir, sv.socket, sv.name, sv.svc,
				kubelet.WithLogger(d.log), kubelet.WithPoll(d.poll), kubelet.WithStopService(sv.svc.Stop),
				kubelet.WithOnRegister(func(err error) {
					if err != nil {
						m.Registrations.WithLabelValues("error").Inc()
					} else {
						m.Registrations.WithLabelValues("ok").Inc()
					}
					reg.set(sv.name, err)
				}))
			rg.Go(func() error { return r.Run(ctx) })
		}
		return rg.Wait()
	})
	return g.Wait()
}

// served is one resource the plugin serves: its name, socket and service.
type served struct {
	name, socket string
	svc          *plugin.Server
}

// resource builds the service of one resource: its table (replicas when
// shared) and its socket in --kubelet-dir.
func (d *Daemon) resource(gpus gpunode.GPUs, r gpuselect.Resource, resp *allocate.Responder, m *metrics.Metrics, svcOpts []plugin.Option) (served, error) {
	sv := served{name: r.Name, socket: d.cfg.PluginSocket}
	if r.Profile != "" && r.Name != d.cfg.ResourceName {
		_, name, _ := strings.Cut(r.Name, "/")
		sv.socket = strings.TrimSuffix(d.cfg.PluginSocket, ".sock") + "-" + name + ".sock"
	}
	if n := len(filepath.Join(d.cfg.KubeletDir, sv.socket)); n > 107 {
		return served{}, fmt.Errorf("resource %s: socket %s in --kubelet-dir=%s is %d bytes, over the 107 unix sockets allow; give a shorter --plugin-socket", r.Name, sv.socket, d.cfg.KubeletDir, n)
	}
	var tableOpts []devices.Option
	opts := append(slices.Clone(svcOpts), plugin.WithReported(gpus.Reported))
	if rep, ok := gpus.Sharing.For(r.Name); ok {
		sv.name = rep.Name
		tableOpts = append(tableOpts, devices.WithReplicas(rep.Replicas))
		if rep.FailRequestsGreaterThanOne {
			opts = append(opts, plugin.WithOneReplicaPerContainer())
		}
	}
	table, err := devices.New(gpus.Node, r.Units, d.id, gpus.CDIName, tableOpts...)
	if err != nil {
		return served{}, err
	}
	ids := make([]string, 0, len(table.Entries()))
	for i, e := range table.Entries() {
		ids = append(ids, e.ID)
		if i%table.Replicas() != 0 {
			continue
		}
		attrs := []any{"resource", sv.name, "id", e.ID, "uuid", e.UUID, "name", e.Device.Name, "numa", e.Device.NUMANode, "cdi_device", e.CDIName}
		if e.MIG != nil {
			attrs = append(attrs, "profile", e.MIG.Profile, "parent", e.Device.UUID)
		}
		if table.Replicas() > 1 {
			attrs = append(attrs, "replicas", table.Replicas())
		}
		d.log.Info("publishing GPU", attrs...)
	}
	if err := resp.Check(ids); err != nil {
		return served{}, err
	}
	sv.svc = plugin.New(table, gpus.Health, resp, m, d.log, opts...)
	return sv, nil
}

// registrations is whether each served resource is registered with
// kubelet: the plugin is ready once all are.
type registrations struct {
	mu    sync.Mutex
	ready *httpserve.Readiness
	names []string
	errs  map[string]error
}

var errNotYet = errors.New("not registered yet")

func newRegistrations(served []served, ready *httpserve.Readiness) *registrations {
	r := &registrations{ready: ready, errs: map[string]error{}}
	for _, s := range served {
		r.names = append(r.names, s.name)
		r.errs[s.name] = errNotYet
	}
	return r
}

func (r *registrations) waiting(socket string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ready.SetNotReady("not registered with kubelet yet (waiting for " + socket + ")")
}

func (r *registrations) set(name string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs[name] = err
	for _, n := range r.names {
		if e := r.errs[n]; e != nil {
			r.ready.SetNotReady(fmt.Sprintf("%s not registered with kubelet: %v", n, e))
			return
		}
	}
	r.ready.SetReady()
}

// awaitMonitoring holds registration until health monitoring is armed,
// NVML checked every GPU and the reported health is that, so kubelet's
// first list is the true one. If it does not arm within the start timeout
// the plugin registers anyway, every GPU Unhealthy with the reason, rather
// than stay invisible. It returns false when ctx ended first.
func (d *Daemon) awaitMonitoring(ctx context.Context, gpus gpunode.GPUs) bool {
	d.ready.SetNotReady("waiting for health monitoring to start")
	timeout := time.NewTimer(d.startTimeout)
	defer timeout.Stop()
	select {
	case <-gpus.Reported.Monitored():
		return true
	case <-timeout.C:
		d.log.Error("health monitoring did not start; registering with every GPU Unhealthy until it does", "waited", d.startTimeout, "reason", gpus.Health.States()[0].Reason)
		return true
	case <-ctx.Done():
		return false
	}
}

func (d *Daemon) responder() (*allocate.Responder, error) {
	return allocate.New(d.cfg.AnnotationPrefix, d.cfg.Strategies...)
}
