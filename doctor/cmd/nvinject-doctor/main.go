// Command nvinject-doctor walks the GPU chain of one node (driver, device
// plugin registration, device health, scheduling, Allocate, CDI/runtime,
// application; on a DRA-mode node ResourceSlice, taints, claim allocation
// and preparation instead) and prints a verdict per layer with the evidence
// and fix.
//
//	nvinject-doctor --kubeconfig ~/.kube/config --node-name k8s-ai-infra-worker
//	nvinject-doctor --json --no-kube      # node-local evidence only
//	nvinject-doctor --explain             # what each layer checks
//	nvinject-doctor explain --pod-namespace default vllm-0   # one pod's GPU chain
//	nvinject-doctor --all-nodes [--selector pool=a100]    # one row per GPU node
//
// Exit status: 0 when no layer is broken, 1 when one is (or the doctor
// failed), 2 on bad usage; with --all-nodes 1 when a node is broken.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/doctor"
	"github.com/nvinject/nvinject/doctor/check"
	"github.com/nvinject/nvinject/doctor/collect"
	"github.com/nvinject/nvinject/doctor/fleet"
	"github.com/nvinject/nvinject/doctor/render"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/logging"
)

const name = "nvinject-doctor"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, connectAPI)
	stop()
	os.Exit(code)
}

// errBroken ends a run whose report has a broken layer (exit 1, the report
// already says why).
var errBroken = errors.New("a layer is broken")

// connectFunc builds --all-nodes' API client and readyz prober from
// --kubeconfig; tests pass a fake clientset.
type connectFunc func(kubeconfig string) (kubernetes.Interface, fleet.Prober, error)

func connectAPI(kubeconfig string) (kubernetes.Interface, fleet.Prober, error) {
	c, err := collect.Client(kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	return c, fleet.ProxyProber{Client: c}, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, connect connectFunc) int {
	err := doctorRun(ctx, args, stdout, stderr, connect)
	if errors.Is(err, errBroken) {
		return cli.ExitFailure
	}
	return cli.Code(name, err, stderr)
}

func doctorRun(ctx context.Context, args []string, stdout, stderr io.Writer, connect connectFunc) error {
	if len(args) > 0 && args[0] == "explain" {
		return explainRun(ctx, args[1:], stdout, stderr)
	}
	d := collect.Defaults()
	o := collect.Options{}
	cdiDirs := cli.NewStringList(d.CDISpecDirs...)
	var asJSON, explain, verbose, allNodes bool
	var selector string
	var logFlags logging.Flags
	timeout := 30 * time.Second
	c := cli.New(name, "[flags]", cli.WithOutput(stdout, stderr), cli.WithAbout(
		"Walks the GPU chain of one node and prints a verdict per layer (ok, broken, unknown) with the evidence and the fix. --explain maps each layer to the GPU troubleshooting table.\n\n'"+name+" explain POD' prints one pod's chain instead (see "+name+" explain --help).\n\n--all-nodes prints one row per GPU node instead, from the API server alone: mode, GPU model, GPUs published/healthy, driver, ok or broken with the first broken layer and its fix."))
	fs := c.Flags()
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: KUBECONFIG, then ~/.kube/config)")
	fs.BoolVar(&o.NoKube, "no-kube", false, "do not consult the API server (node-local evidence only)")
	fs.BoolVar(&o.Remote, "remote", false, "not on the worker: skip its files, sockets and nvidia-smi (API and pod-network evidence only)")
	fs.StringVar(&o.Node, "node-name", "", "Node name of the GPU worker (default: the only node, or the only one publishing the resource)")
	fs.StringVar(&o.KubeletDir, "kubelet-dir", d.KubeletDir, "kubelet device-plugins directory")
	fs.StringVar(&o.PodResourcesSocket, "pod-resources-socket", d.PodResourcesSocket, "kubelet's PodResources socket (which container holds which GPU)")
	fs.Var(cdiDirs, "cdi-spec-dir", "CDI spec directories (comma list, repeatable)")
	fs.StringVar(&o.ContainerdConfig, "containerd-config", d.ContainerdConfig, "containerd config file (its imports are followed)")
	fs.StringVar(&o.DriverRoot, "driver-root", "", "the NVIDIA driver's root on the worker, whose version the CDI spec must match (default: the daemon's --host-driver-root, else /)")
	fs.StringVar(&o.NvidiaSMI, "nvidia-smi", d.NvidiaSMI, "nvidia-smi command line, run with the query appended; may reach into the worker: \"docker exec k8s-ai-infra-worker nvidia-smi\"")
	fs.StringVar(&o.DevicePluginMetrics, "device-plugin-metrics", "", "nvinject-device-plugin metrics URL (default: found from its pod on the node)")
	fs.StringVar(&o.NRIMetrics, "nri-metrics", "", "nvinject-nri metrics URL (default: found from its pod on the node)")
	fs.StringVar(&o.DRAMetrics, "dra-metrics", "", "nvinject-dra metrics URL (default: found from its pod on the node)")
	fs.StringVar(&o.Mode, "mode", "", "the node's owner of the GPU: "+contract.DRAModeDevicePlugin+" or "+contract.DRAModeDRA+" (default: the Node's "+contract.DRAModeLabel+" label, else the nvinject daemon running there)")
	fs.StringVar(&o.DaemonNamespace, "daemon-namespace", d.DaemonNamespace, "namespace of nvinject's DaemonSets")
	fs.StringVar(&o.PodSelector, "pod-selector", "", "label selector of the application's pods (default: every pod on the node requesting the resource)")
	fs.StringVar(&o.PodNamespace, "pod-namespace", "", "namespace of the application's pods (default: all)")
	fs.StringVar(&o.Resource, "resource-name", d.Resource, "extended resource name")
	fs.StringVar(&o.RuntimeClass, "runtime-handler", d.RuntimeClass, "RuntimeClass name and containerd runtime handler of GPU pods")
	fs.StringVar(&o.CDIVendor, "cdi-vendor", d.CDIVendor, "CDI vendor of nvinject's GPU devices")
	fs.StringVar(&o.CDIClass, "cdi-class", d.CDIClass, "CDI class of nvinject's GPU devices")
	fs.StringVar(&o.ConfigMapNamespace, "configmap-namespace", d.ConfigMapNamespace, "namespace of the selected-GPU ConfigMap")
	fs.StringVar(&o.ConfigMapName, "configmap", d.ConfigMapName, "ConfigMap holding the selected GPU UUID")
	fs.BoolVar(&allNodes, "all-nodes", false, "one row per GPU node, read from the API server alone (runs from an operator's machine); exit 1 when a node is broken")
	fs.StringVar(&selector, "selector", "", "with --all-nodes: label selector of the nodes (default: all GPU nodes)")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON (--all-nodes: an array of rows)")
	fs.BoolVar(&explain, "explain", false, "print what each layer checks and the troubleshooting row it answers, then exit")
	fs.BoolVar(&verbose, "v", false, "log collector progress to stderr (same as --log-level=debug)")
	fs.DurationVar(&timeout, "timeout", timeout, "overall time limit")
	logFlags.Register(fs, logging.Text)
	c.Deprecated("node", "node-name")
	c.Deprecated("resource", "resource-name")
	c.Deprecated("runtime-class", "runtime-handler")
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if o.Mode != "" && o.Mode != contract.DRAModeDevicePlugin && o.Mode != contract.DRAModeDRA {
		return cli.Usagef("--mode %q: want %s or %s", o.Mode, contract.DRAModeDevicePlugin, contract.DRAModeDRA)
	}
	if len(c.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q; everything is given by flags", c.Args())
	}
	if selector != "" && !allNodes {
		return cli.Usagef("--selector selects the nodes of --all-nodes; give --all-nodes too")
	}
	if allNodes && (o.Node != "" || o.NoKube) {
		return cli.Usagef("--all-nodes reads every GPU node from the API server: drop --node-name and --no-kube")
	}
	if explain {
		return render.WriteExplain(stdout)
	}
	if verbose {
		logFlags.Level = "debug"
	} else if logFlags.Level == "info" {
		logFlags.Level = "error"
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	o.Logger, o.CDISpecDirs = log, cdiDirs.Values
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if allNodes {
		return fleetRun(ctx, connect, o.Kubeconfig, fleet.Options{Selector: selector, Namespace: o.DaemonNamespace}, asJSON, stdout)
	}
	r, err := doctor.Run(ctx, o)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w; raise --timeout or check which input hangs with -v", err)
		}
		return err
	}
	write := render.WriteTable
	if asJSON {
		write = func(w io.Writer, r check.Report) error { return render.WriteJSON(w, r) }
	}
	if err := write(stdout, r); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if len(r.Broken()) > 0 {
		return errBroken
	}
	return nil
}

// fleetRun is --all-nodes: one row per GPU node.
func fleetRun(ctx context.Context, connect connectFunc, kubeconfig string, fo fleet.Options, asJSON bool, stdout io.Writer) error {
	c, prober, err := connect(kubeconfig)
	if err != nil {
		return err
	}
	fo.Prober = prober
	rows, err := fleet.Rows(ctx, c, fo)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w; raise --timeout", err)
		}
		return err
	}
	write := fleet.WriteTable
	if asJSON {
		write = fleet.WriteJSON
	}
	if err := write(stdout, rows); err != nil {
		return fmt.Errorf("write rows: %w", err)
	}
	if fleet.Broken(rows) {
		return errBroken
	}
	return nil
}

// explainRun is `nvinject-doctor explain [flags] POD`: one pod's chain from
// nvinject-nri's audit Events and the live objects. Flags may follow POD.
func explainRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	d := collect.Defaults()
	o := collect.Options{PodNamespace: collect.DefaultPodNamespace}
	var asJSON bool
	var logFlags logging.Flags
	timeout := 30 * time.Second
	c := cli.New(name+" explain", "[flags] POD", cli.WithOutput(stdout, stderr), cli.WithAbout(
		"Prints how one pod's containers got their GPU, or why not: the GPUs each container requests, the claims' allocation, what kubelet assigned, the CDI names, the GPU device nodes, mounts and UUID environment nvinject-nri checked in the final container, and its verdict, from the audit Events nvinject-nri records on the pod ("+contract.EventReasonGPUAdmitted+", "+contract.EventReasonGPURefused+") and the live objects. Without a record it says why (no API access for nvinject-nri, not yet created, refused before nvinject-nri was asked, Events expired)."))
	fs := c.Flags()
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&o.PodNamespace, "pod-namespace", o.PodNamespace, "namespace of the pod")
	fs.StringVar(&o.DaemonNamespace, "daemon-namespace", d.DaemonNamespace, "namespace of nvinject's DaemonSets")
	fs.StringVar(&o.NRIMetrics, "nri-metrics", "", "nvinject-nri metrics URL (default: found from its pod on the pod's node)")
	fs.StringVar(&o.Resource, "resource-name", d.Resource, "extended resource name")
	fs.BoolVar(&asJSON, "json", false, "print the chain and its evidence as JSON")
	fs.DurationVar(&timeout, "timeout", timeout, "overall time limit")
	logFlags.Register(fs, logging.Text)
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if rest := c.Args(); len(rest) > 0 {
		// The flag package stops at POD; flags after it are parsed too.
		pod := rest[0]
		if err := c.Parse(rest[1:], nil); err != nil {
			return err
		}
		args = append([]string{pod}, c.Args()...)
	} else {
		args = nil
	}
	if len(args) != 1 {
		return cli.Usagef("explain takes one pod name, got %q (see %s explain --help)", args, name)
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	o.Logger = log
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := doctor.RunExplain(ctx, o, args[0])
	if err != nil {
		return fmt.Errorf("explain %s/%s: %w", o.PodNamespace, args[0], err)
	}
	if asJSON {
		return render.WriteJSON(stdout, r)
	}
	return render.WriteExplanation(stdout, r.Explanation)
}
