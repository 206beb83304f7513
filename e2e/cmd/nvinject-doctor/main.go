// Command nvinject-doctor walks the GPU chain of one node (driver, device
// plugin registration, device health, scheduling, Allocate, CDI/runtime,
// application) and prints a verdict per layer with the evidence and fix.
//
//	nvinject-doctor --kubeconfig ~/.kube/config --node k8s-ai-infra-worker
//	nvinject-doctor --json --no-kube      # node-local evidence only
//
// Exit status: 0 when no layer is broken, 1 when one is, 2 on bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/e2e/doctor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// dirList is a repeatable, comma-separated flag.
type dirList []string

func (d *dirList) String() string { return strings.Join(*d, ",") }

func (d *dirList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*d = append(*d, s)
		}
	}
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	d := doctor.Defaults()
	o := doctor.Options{}
	var cdiDirs dirList
	var asJSON, verbose bool
	timeout := 30 * time.Second
	fs := flag.NewFlagSet("nvinject-doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: KUBECONFIG, then ~/.kube/config)")
	fs.BoolVar(&o.NoKube, "no-kube", false, "do not consult the API server (node-local evidence only)")
	fs.BoolVar(&o.Remote, "remote", false, "not on the worker: skip its files, sockets, nvidia-smi and daemon metrics (API evidence only)")
	fs.StringVar(&o.Node, "node", "", "Node name of the GPU worker (default: the only node, or the only one publishing the resource)")
	fs.StringVar(&o.KubeletDir, "kubelet-dir", d.KubeletDir, "kubelet device-plugins directory")
	fs.Var(&cdiDirs, "cdi-spec-dir", "CDI spec directory (repeatable or comma list; default "+strings.Join(d.CDISpecDirs, ",")+")")
	fs.StringVar(&o.ContainerdConfig, "containerd-config", d.ContainerdConfig, "containerd config file (its imports are followed)")
	fs.StringVar(&o.NvidiaSMI, "nvidia-smi", d.NvidiaSMI, "nvidia-smi command line, run with the query appended; may reach into the worker: \"docker exec k8s-ai-infra-worker nvidia-smi\" (simulated node: a GPU pod's nvidia-smi via kubectl exec)")
	fs.StringVar(&o.DevicePluginMetrics, "device-plugin-metrics", d.DevicePluginMetrics, "nvinject-device-plugin metrics URL")
	fs.StringVar(&o.NRIMetrics, "nri-metrics", d.NRIMetrics, "nvinject-nri metrics URL")
	fs.StringVar(&o.PodSelector, "pod-selector", d.PodSelector, "label selector of the application's pods")
	fs.StringVar(&o.PodNamespace, "pod-namespace", "", "namespace of the application's pods (default: all)")
	fs.StringVar(&o.Resource, "resource", d.Resource, "extended resource name")
	fs.StringVar(&o.RuntimeClass, "runtime-class", d.RuntimeClass, "RuntimeClass (and containerd handler) name")
	fs.StringVar(&o.ConfigMapNamespace, "configmap-namespace", d.ConfigMapNamespace, "namespace of the selected-GPU ConfigMap")
	fs.StringVar(&o.ConfigMapName, "configmap", d.ConfigMapName, "ConfigMap holding the selected GPU UUID")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fs.BoolVar(&verbose, "v", false, "log collector progress to stderr")
	fs.DurationVar(&timeout, "timeout", timeout, "overall time limit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "nvinject-doctor: unexpected arguments %q; everything is given by flags\n", fs.Args())
		return 2
	}
	level := slog.LevelError
	if verbose {
		level = slog.LevelDebug
	}
	o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	o.CDISpecDirs = cdiDirs
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := doctor.Run(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "nvinject-doctor: %v\n", err)
		if errors.Is(err, context.DeadlineExceeded) {
			fmt.Fprintln(stderr, "nvinject-doctor: raise --timeout or check which input hangs with -v")
		}
		return 2
	}
	write := doctor.WriteTable
	if asJSON {
		write = doctor.WriteJSON
	}
	if err := write(stdout, r); err != nil {
		fmt.Fprintf(stderr, "nvinject-doctor: write report: %v\n", err)
		return 2
	}
	if len(r.Broken()) > 0 {
		return 1
	}
	return 0
}
