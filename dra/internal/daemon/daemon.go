// Package daemon wires nvinject-dra's DRA protocol onto the GPU node
// (gpunode: NVML, selection, the one CDI spec, health, the metrics and
// health endpoints): the DRA driver (internal/driver) behind
// k8s.io/dynamic-resource-allocation's kubeletplugin helper (registration,
// DRA and health gRPC services, ResourceSlice publication), the held-GPU
// taints and the empty device-plugin endpoint. Every goroutine belongs to
// an errgroup and is waited for.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/claimspec"
	"github.com/nvinject/nvinject/dra/internal/config"
	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/dra/internal/kubeapi"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/gpunode/kubelet/endpoint"
	"github.com/nvinject/nvinject/gpunode/nodelabels/typednodes"
	"github.com/nvinject/nvinject/gpunode/nodemove"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/httpserve"
)

// Daemon is one nvinject-dra process.
type Daemon struct {
	cfg      config.Config
	log      *slog.Logger
	client   kubernetes.Interface
	resend   time.Duration
	lease    time.Duration
	onStart  func(*driver.Driver)
	hold     func(ctx context.Context, kubeletDir, resource string, log *slog.Logger) error
	nodeOpts []gpunode.Option

	node  *gpunode.Node
	ready *httpserve.Readiness
	// state is the checkpoint of prepared claims, open while Run runs.
	state *checkpoint.Store
	// err is why the daemon cannot run (its API client), from New.
	err error
}

// Option configures a Daemon.
type Option func(*Daemon)

// WithNode configures the GPU node under the driver (gpunode.WithOpen,
// WithRecoverSignal, WithNVMLRetry).
func WithNode(opts ...gpunode.Option) Option {
	return func(d *Daemon) { d.nodeOpts = append(d.nodeOpts, opts...) }
}

// WithKubeClient replaces the API client built from --kubeconfig (tests).
func WithKubeClient(c kubernetes.Interface) Option { return func(d *Daemon) { d.client = c } }

// WithTimings sets the health report resend period and the lease of
// kubelet's health stream (tests shorten them).
func WithTimings(resend, lease time.Duration) Option {
	return func(d *Daemon) { d.resend, d.lease = resend, lease }
}

// WithHoldEndpoint replaces endpoint.Hold, which holds the empty
// device-plugin endpoint with --hold-resource-endpoint (tests).
func WithHoldEndpoint(f func(ctx context.Context, kubeletDir, resource string, log *slog.Logger) error) Option {
	return func(d *Daemon) { d.hold = f }
}

// WithOnStart is called with the driver once it serves (tests, benchmarks).
func WithOnStart(f func(*driver.Driver)) Option { return func(d *Daemon) { d.onStart = f } }

// New returns a daemon for cfg.
func New(cfg config.Config, log *slog.Logger, opts ...Option) *Daemon {
	d := &Daemon{cfg: cfg, log: log, ready: httpserve.NewReadiness("starting"), hold: endpoint.Hold, resend: 10 * time.Second, lease: 30 * time.Second, onStart: func(*driver.Driver) {}}
	for _, o := range opts {
		o(d)
	}
	if d.client == nil {
		d.client, d.err = kubeapi.NewClient(cfg.Kubeconfig, config.Name)
	}
	var labels []gpunode.Option
	if cfg.NodeLabels && d.err == nil {
		labels = append(labels, gpunode.WithNodeLabels(typednodes.New(d.client.CoreV1().Nodes()), contract.MetricDRALabelApplies))
	}
	d.node = gpunode.New(cfg.Config, log, append(append([]gpunode.Option{
		gpunode.WithReady(d.ready.Ready), gpunode.WithClaimMPS(),
		gpunode.WithHealthMetrics(gpunode.HealthMetrics{
			Events: contract.MetricDRAHealthEvents, Healthy: contract.MetricDRADeviceHealthy,
			HealthyHelp: "1 when the published GPU is Healthy, 0 when Unhealthy (tainted).", DeviceLabel: "device",
			DeviceID: driver.DeviceName, Coalesced: contract.MetricDRAHealthCoalesced,
		}),
		gpunode.WithRepublishMetric(contract.MetricDRARepublishes),
	}, labels...), append(d.nodeOpts, d.migOnDemand()...)...)...)
	return d
}

// Ready is nil once NVML is open and kubelet accepted the registration,
// else why not.
func (d *Daemon) Ready() error { return d.node.Ready() }

// Run runs until ctx ends or a part fails; it returns the first failure.
// Every goroutine it starts has ended when it returns, and NVML is closed
// only after the health watch and the driver stopped.
func (d *Daemon) Run(ctx context.Context) error {
	if d.err != nil {
		return d.err
	}
	m := newMetrics(d.node.Registry())
	state, err := checkpoint.Open(d.cfg.StateDir)
	if err != nil {
		return err
	}
	defer state.Close()
	d.state = state
	return d.node.Run(ctx, func(ctx context.Context, g gpunode.GPUs) error { return d.serve(ctx, d.client, g, m) })
}

// migOnDemand lets the node make MIG devices (--mig-on-demand): the ones
// the checkpoint's claims made are the driver's, not a new layout.
func (d *Daemon) migOnDemand() []gpunode.Option {
	if !d.cfg.MIGOnDemand {
		return nil
	}
	return []gpunode.Option{gpunode.WithMIGOnDemand(func(parent string, at gpu.MIGPlacement) bool {
		return driver.OwnsMIG(d.state, parent, at)
	})}
}

// serve runs the DRA driver over the node's GPUs behind kubelet's plugin
// helper until ctx ends or the driver fails; it returns after everything
// it started did.
func (d *Daemon) serve(ctx context.Context, client kubernetes.Interface, gpus gpunode.GPUs, m *metrics) error {
	if err := os.MkdirAll(d.cfg.DriverPluginDir(), 0o750); err != nil {
		return fmt.Errorf("create the plugin dir %s: %w; check --kubelet-plugins-dir", d.cfg.DriverPluginDir(), err)
	}
	state := d.state
	fatal := make(chan error, 1)
	opts := []driver.Option{driver.WithLogger(d.log), driver.WithMetrics(m), driver.WithHealthTiming(d.resend, d.lease),
		driver.WithClaimLookup(kubeapi.Claims(client)), driver.WithReported(gpus.Reported),
		driver.WithClaimSpecs(claimspec.New(d.cfg.CDISpecDir, d.cfg.CDIVendor)),
		driver.WithFatal(func(err error) {
			select {
			case fatal <- err:
			default:
			}
		})}
	if gpus.MPS != nil {
		opts = append(opts, driver.WithMPS(gpus.MPS))
	}
	if d.cfg.Shares {
		opts = append(opts, driver.WithShares())
	}
	if gpus.MIG != nil {
		opts = append(opts, driver.WithMIGOnDemand(gpus.MIG))
	}
	drv, err := driver.New(d.cfg.NodeName, gpus.Node, gpus.Published, gpus.CDIName, gpus.Health, state, opts...)
	if err != nil {
		return err
	}
	placements := map[string]int{}
	for _, dev := range drv.Devices() {
		if dev.Share {
			d.log.Info("publishing GPU share device", "device", dev.Name, "uuid", dev.UUID, "class", contract.DRAShareClass)
			continue
		}
		if dev.Slot != nil {
			placements[dev.UUID]++
			continue
		}
		if dev.MIG != nil {
			d.log.Info("publishing MIG device", "device", dev.Name, "uuid", dev.MIG.UUID, "profile", dev.MIG.Profile, "parent_uuid", dev.UUID, "numa", dev.NUMANode, "cdi_device", dev.CDIName)
			continue
		}
		d.log.Info("publishing GPU", "device", dev.Name, "uuid", dev.UUID, "name", dev.Device.Name, "numa", dev.NUMANode, "cdi_device", dev.CDIName)
	}
	for uuid, n := range placements {
		d.log.Info("publishing a MIG GPU by its placements: a claim's MIG device is made at prepare (--mig-on-demand)", "uuid", uuid, "placements", n)
	}
	d.log.Info("checkpoint loaded", "path", state.Path(), "prepared_claims", state.Len())

	d.ready.SetNotReady("not registered with kubelet yet (registration socket in " + d.cfg.RegistrarDir + ")")
	kctx := klog.NewContext(ctx, logr.FromSlogHandler(d.log.Handler()))
	helper, err := kubeletplugin.Start(kctx, drv,
		kubeletplugin.DriverName(contract.DRADriver), kubeletplugin.NodeName(d.cfg.NodeName), kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(d.cfg.RegistrarDir), kubeletplugin.PluginDataDirectoryPath(d.cfg.DriverPluginDir()),
		kubeletplugin.GRPCInterceptor(d.registrationSeen(m)))
	if err != nil {
		return fmt.Errorf("start the kubelet plugin (registrar dir %s, plugin dir %s): %w; check that both exist on the host and are mounted at the same paths", d.cfg.RegistrarDir, d.cfg.DriverPluginDir(), err)
	}
	ctx, cancel := context.WithCancel(ctx)
	g, ctx := errgroup.WithContext(ctx)
	if err = d.followHeld(ctx, g, drv, gpus); err == nil {
		g.Go(func() error { return drv.Publish(ctx, helper) })
		if d.cfg.HoldEndpoint {
			g.Go(func() error {
				return d.hold(ctx, d.cfg.KubeletDir, d.cfg.ResourceName, d.log.With("component", "resource-endpoint"))
			})
		}
		d.onStart(drv)
		select {
		case <-ctx.Done():
		case err = <-fatal:
		}
	}
	cancel()
	helper.Stop()
	nodemove.ReleaseIfMovedAway(kubeapi.Nodes{Client: client}, d.cfg.NodeName, d.cfg.OwnerLabel, d.log)
	return errors.Join(err, g.Wait())
}

// followHeld taints the GPUs that pods given them by the device plugin
// still hold (a node moved to DRA under them): the first ResourceSlice
// already carries the taints, and a poll keeps them current until ctx
// ends. While PodResources cannot be read every GPU is tainted (fail
// closed).
func (d *Daemon) followHeld(ctx context.Context, g *errgroup.Group, drv *driver.Driver, gpus gpunode.GPUs) error {
	if d.cfg.PodResourcesSocket == "" {
		d.log.Warn("--pod-resources-socket is empty: GPUs that device-plugin pods still hold are not tainted, so a claim may get one of them (a node moved to DRA under running pods)")
		return nil
	}
	src := nodemove.DevicePluginPods(d.cfg.ResourceName)
	w, err := nodemove.Dial(d.cfg.PodResourcesSocket, src, gpus.Node.Devices)
	if err != nil {
		return err
	}
	held := nodemove.NewSet(src, gpus.UUIDs(), d.log, func(_ []string, r nodemove.Result) {
		if r.Err != nil {
			drv.SetHeldUnknown()
			return
		}
		byUUID := make(map[string][]string, len(r.Holders))
		for u, hs := range r.Holders {
			byUUID[u] = nodemove.Strings(hs)
		}
		drv.SetHeld(byUUID)
	})
	g.Go(func() error { w.Follow(ctx, held); return nil })
	select {
	case <-held.Read():
	case <-ctx.Done():
	}
	return nil
}

// registrationSeen is a gRPC interceptor on the helper's servers: kubelet's
// NotifyRegistrationStatus flips readiness. (Helper.RegistrationStatus is
// not safe to poll while kubelet calls.)
func (d *Daemon) registrationSeen(m *metrics) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if st, ok := req.(*registerapi.RegistrationStatus); ok {
			switch {
			case st.PluginRegistered:
				d.log.Info("registered with kubelet", "driver", contract.DRADriver)
				m.registered.Set(1)
				d.ready.SetReady()
			case strings.Contains(st.Error, "already registered for DRA driver plugin"):
				// kubelet 1.37's plugin manager refuses a second registration
				// of an endpoint it holds and keeps the first in force.
				d.log.Warn("kubelet refused a repeated registration of this endpoint; its earlier registration stays in force", "driver", contract.DRADriver, "error", st.Error)
			default:
				d.log.Error("kubelet refused the registration", "driver", contract.DRADriver, "error", st.Error)
				m.registered.Set(0)
				d.ready.SetNotReady("kubelet refused the registration: " + st.Error)
			}
		}
		return handler(ctx, req)
	}
}
