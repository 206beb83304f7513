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
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nvinject/nvinject/deviceplugin/endpoint"
	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/config"
	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/gpunode/nodemove"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/httpserve"
	"github.com/nvinject/nvinject/shared/logging"
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
	d.node = gpunode.New(cfg.Config, log, append([]gpunode.Option{
		gpunode.WithReady(d.ready.Ready),
		gpunode.WithHealthMetrics(gpunode.HealthMetrics{
			Events: contract.MetricDRAHealthEvents, Healthy: contract.MetricDRADeviceHealthy,
			HealthyHelp: "1 when the published GPU is Healthy, 0 when Unhealthy (tainted).", DeviceLabel: "device",
			DeviceID: driver.DeviceName,
		}),
	}, d.nodeOpts...)...)
	return d
}

// Ready is nil once NVML is open and kubelet accepted the registration,
// else why not.
func (d *Daemon) Ready() error { return d.node.Ready() }

// Run runs until ctx ends or a part fails; it returns the first failure.
// Every goroutine it starts has ended when it returns, and NVML is closed
// only after the health watch and the driver stopped.
func (d *Daemon) Run(ctx context.Context) error {
	m := newMetrics(d.node.Registry())
	client, err := d.kubeClient()
	if err != nil {
		return err
	}
	return d.node.Run(ctx, func(ctx context.Context, g gpunode.GPUs) error { return d.serve(ctx, client, g, m) })
}

// serve runs the DRA driver over the node's GPUs behind kubelet's plugin
// helper until ctx ends or the driver fails; it returns after everything
// it started did.
func (d *Daemon) serve(ctx context.Context, client kubernetes.Interface, gpus gpunode.GPUs, m *metrics) error {
	if err := os.MkdirAll(d.cfg.DriverPluginDir(), 0o750); err != nil {
		return fmt.Errorf("create the plugin dir %s: %w; check --kubelet-plugins-dir", d.cfg.DriverPluginDir(), err)
	}
	state, err := checkpoint.Open(d.cfg.StateDir)
	if err != nil {
		return err
	}
	fatal := make(chan error, 1)
	drv, err := driver.New(d.cfg.NodeName, gpus.Node, gpus.Published, gpus.CDIName, gpus.Health, state,
		driver.WithLogger(d.log), driver.WithMetrics(m), driver.WithHealthTiming(d.resend, d.lease),
		driver.WithClaimLookup(func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
			c, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return c, err
		}),
		driver.WithFatal(func(err error) {
			select {
			case fatal <- err:
			default:
			}
		}))
	if err != nil {
		return err
	}
	for _, dev := range drv.Devices() {
		d.log.Info("publishing GPU", "device", dev.Name, "uuid", dev.UUID, "name", dev.Device.Name, "numa", dev.NUMANode, "cdi_device", dev.CDIName)
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
	if d.cfg.PodResourcesSocket != "" {
		err = d.watchHeld(ctx, g, drv, gpus.Node.Devices)
	} else {
		d.log.Warn("--pod-resources-socket is empty: GPUs that device-plugin pods still hold are not tainted, so a claim may get one of them (a node moved to DRA under running pods)")
	}
	if err == nil {
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
	d.releaseIfMovedAway(client)
	return errors.Join(err, g.Wait())
}

// releaseIfMovedAway deletes the node's ResourceSlices when nvinject-dra
// stops because the node no longer selects it (--owner-label no longer
// says dra). kubelet would wipe them only 30 s after the plugin is gone; a
// claim allocated from them meanwhile leaves its pod stuck in
// ContainerCreating, since no driver prepares it. A restart on a DRA node
// keeps them, so claims can still be allocated while it restarts.
func (d *Daemon) releaseIfMovedAway(client kubernetes.Interface) {
	if d.cfg.OwnerLabel == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := client.CoreV1().Nodes().Get(ctx, d.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		d.log.Warn("cannot read the Node to tell a move from a restart; leaving the ResourceSlices to kubelet", "node", d.cfg.NodeName, logging.Err(err))
		return
	}
	if v := n.Labels[d.cfg.OwnerLabel]; v == contract.DRAModeDRA {
		return
	}
	sel := fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", d.cfg.NodeName), fields.OneTermEqualSelector("spec.driver", contract.DRADriver)).String()
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err == nil {
		for _, rs := range list.Items {
			if rs.Spec.Driver != contract.DRADriver || rs.Spec.NodeName == nil || *rs.Spec.NodeName != d.cfg.NodeName {
				continue
			}
			if err = client.ResourceV1().ResourceSlices().Delete(ctx, rs.Name, metav1.DeleteOptions{}); apierrors.IsNotFound(err) {
				err = nil
			}
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		d.log.Warn("cannot delete the ResourceSlices of a node moved away from DRA; kubelet removes them within 30 s", "node", d.cfg.NodeName, logging.Err(err))
		return
	}
	d.log.Info("node moved away from DRA: ResourceSlices deleted", "node", d.cfg.NodeName, "label", d.cfg.OwnerLabel+"="+n.Labels[d.cfg.OwnerLabel])
}

// watchHeld taints the GPUs pods given them by the device plugin still hold
// (a node moved to DRA under them): the first ResourceSlice already
// carries the taints, and a poll keeps them current until ctx ends. While
// PodResources cannot be read every GPU is tainted (fail closed).
func (d *Daemon) watchHeld(ctx context.Context, g *errgroup.Group, drv *driver.Driver, gpus []gpu.Device) error {
	w, err := nodemove.Dial(d.cfg.PodResourcesSocket, nodemove.DevicePluginPods(d.cfg.ResourceName), gpus)
	if err != nil {
		return err
	}
	var first nodemove.Result
	first.Holders, first.Err = w.Poll(ctx)
	set := d.heldSetter(drv)
	set(first)
	g.Go(func() error {
		defer w.Close()
		w.Run(ctx, first, set)
		return nil
	})
	return nil
}

// heldSetter passes each poll to the driver and logs when PodResources
// turns unreadable or readable again.
func (d *Daemon) heldSetter(drv *driver.Driver) func(nodemove.Result) {
	failing := false
	return func(r nodemove.Result) {
		if r.Err != nil {
			d.log.Error("GPUs held by device-plugin pods unknown: every GPU is tainted until kubelet's PodResources can be read (fail closed)",
				"taint", contract.DRAHeldTaintKey+"="+contract.DRAHeldTaintUnknown, logging.Err(r.Err))
			failing = true
			drv.SetHeldUnknown()
			return
		}
		if failing {
			d.log.Info("kubelet's PodResources readable again; only GPUs device-plugin pods hold stay tainted", "socket", d.cfg.PodResourcesSocket)
			failing = false
		}
		held := make(map[string][]string, len(r.Holders))
		for u, hs := range r.Holders {
			held[u] = nodemove.Strings(hs)
		}
		drv.SetHeld(held)
	}
}

func (d *Daemon) kubeClient() (kubernetes.Interface, error) {
	if d.client != nil {
		return d.client, nil
	}
	var (
		cfg *rest.Config
		err error
	)
	if d.cfg.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", d.cfg.Kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API server configuration (--kubeconfig=%s): %w; give a kubeconfig, or run in a pod with a service account (a node without kube-proxy: set KUBERNETES_SERVICE_HOST/PORT to the API server's address)", contract.Quote(d.cfg.Kubeconfig), err)
	}
	cfg.UserAgent = config.Name
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client for %s: %w", cfg.Host, err)
	}
	return c, nil
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
