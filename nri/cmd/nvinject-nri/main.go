// Command nvinject-nri is nvinject's containerd NRI plugin: for pods of the
// nvidia RuntimeClass it resolves the CDI devices allocated to each
// container, applies their edits and checks the GPU UUIDs it really gets.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/collect"
	"github.com/nvinject/nvinject/nri/internal/config"
	"github.com/nvinject/nvinject/nri/internal/conn"
	"github.com/nvinject/nvinject/nri/internal/events"
	"github.com/nvinject/nvinject/nri/internal/metrics"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/httpserve"
	"github.com/nvinject/nvinject/shared/kubeclient"
	"github.com/nvinject/nvinject/shared/logging"
	"github.com/nvinject/nvinject/shared/podresources"
	"github.com/nvinject/nvinject/shared/version"
)

const name = "nvinject-nri"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := start(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.Code(name, err, os.Stderr))
}

func start(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := config.Parse(args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	log, err := logging.New(stderr, cfg.LogFormat, cfg.LogLevel)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	if err := run(ctx, cfg, log); err != nil {
		log.Error(name+" failed", logging.Err(err))
		return err
	}
	return nil
}

func run(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	// The audit writers (Events, verdict lines) live as long as run:
	// cancelled, then waited for.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	col, err := collect.New(collect.WithAnnotationPrefix(cfg.AnnotationPrefix))
	if err != nil {
		return err
	}
	res, err := resolve.New(cfg.CDISpecDirs, resolve.WithLogger(log))
	if err != nil {
		return err
	}
	defer res.Close()
	for _, e := range res.SpecErrors() {
		log.Warn("CDI spec skipped", "error", e)
	}

	opts := []plugin.Option{
		plugin.WithLogger(log), plugin.WithMetrics(m), plugin.WithRuntimeHandlers(cfg.RuntimeHandlers...),
		plugin.WithKind(cfg.CDIVendor, cfg.CDIClass), plugin.WithResourceName(cfg.ResourceName),
		plugin.WithRequestDeadline(cfg.RequestDeadline),
	}
	if cfg.NVML != "" {
		inv, err := inventory(ctx, cfg)
		if err != nil {
			return err
		}
		log.Info("GPU inventory read", "gpus", len(inv.GPUs), "mig_devices", len(inv.MIG), "nvml", cfg.NVML)
		opts = append(opts, plugin.WithInventory(inv), plugin.WithInventoryRefresh(func(ctx context.Context) (*verify.Inventory, error) { return inventory(ctx, cfg) }))
	}
	if cfg.PodResourcesSocket != "" {
		pr, err := podresources.Dial(cfg.PodResourcesSocket)
		if err != nil {
			return err
		}
		defer pr.Close()
		opts = append(opts, plugin.WithKubelet(pr))
	}
	if api, err := apiClient(cfg.Kubeconfig); err != nil {
		log.Warn("no API server access: audit Events are off; verdicts are the same and logged", logging.Err(err))
		m.AuditEnabled(false)
	} else {
		sink := events.New(api, events.WithLogger(log), events.WithCounter(m), events.WithNodeName(cfg.NodeName))
		wg.Go(func() { sink.Run(ctx) })
		m.AuditEnabled(true)
		opts = append(opts, plugin.WithAuditor(sink))
	}
	verdicts := audit.NewLog(log, 1024)
	wg.Go(func() { verdicts.Run(ctx) })
	opts = append(opts, plugin.WithVerdictLog(verdicts))
	h := plugin.NewHandler(col, res, opts...)
	// With simulated GPUs the simulation's faults wrap the handler and
	// drive the runner; a real node runs the handler as it is.
	var p conn.Plugin = h
	var faults *simulationFaults
	if cfg.Simulated() {
		faults = newSimulationFaults(h, cfg.SimDelay)
		p = faults
	}
	runner := conn.New(p, cfg.PluginName, cfg.PluginIdx, cfg.SocketPath, conn.WithLogger(log), conn.WithMetrics(m))

	srv := httpserve.New(cfg.MetricsAddr, reg, httpserve.WithReady(runner.Ready), httpserve.WithLogger(log))
	if faults != nil {
		faults.serve(srv, runner)
		log.Warn("SIMULATION: fault injection endpoints enabled", "endpoints", "/debug/sim/delay, /debug/sim/disconnect", "sim_delay", cfg.SimDelay.String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Run(ctx) }()
	log.Info("starting", "version", version.Version, "revision", version.Rev(), "socket", cfg.SocketPath, "plugin", cfg.PluginIdx+"-"+cfg.PluginName,
		"cdi_spec_dirs", cfg.CDISpecDirs, "runtime_handlers", cfg.RuntimeHandlers, "pod_resources", cfg.PodResourcesSocket,
		"cdi_kind", cfg.CDIVendor+"/"+cfg.CDIClass, "cdi_annotation_prefix", cfg.AnnotationPrefix, "resource_name", cfg.ResourceName,
		"request_deadline", cfg.RequestDeadline.String(), "node_name", cfg.NodeName)
	if err := runner.Run(ctx); err != nil {
		return err
	}
	return <-errc
}

// apiClient is the client the audit Events go through: --kubeconfig, else
// the pod's service account. Only core/v1: the whole clientset would
// triple the binary.
func apiClient(kubeconfig string) (*typedcorev1.CoreV1Client, error) {
	cfg, err := kubeclient.Config(kubeconfig, name)
	if err != nil {
		return nil, err
	}
	// kubelet's own Event rate (--event-qps, --event-burst); client-go's
	// default 5/s would queue a burst of GPU pods.
	cfg.QPS, cfg.Burst = 50, 100
	c, err := typedcorev1.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client for %s: %w", cfg.Host, err)
	}
	return c, nil
}

// inventory reads the node's GPUs and MIG devices: at start, and again only
// when a container's devices are not in it (a MIG layout changed); the hot
// path never asks NVML otherwise.
func inventory(ctx context.Context, cfg config.Config) (*verify.Inventory, error) {
	b, err := backend.Open(cfg.NVML, backend.Options{DriverRoot: cfg.DriverRoot, DevRoot: cfg.DevRoot})
	if err != nil {
		return nil, err
	}
	defer b.Close()
	node, err := b.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs with --nvml=%s: %w", cfg.NVML, err)
	}
	return verify.InventoryOf(node), nil
}
