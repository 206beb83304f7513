// Command demo is `make demo`: it brings up a real single-node
// Kubernetes (e2e/harness/kubelocal) whose only simulated part is the GPU (a
// SIMULATED A100 80GB), deploys nvinject with kubectl apply -k, runs the vLLM
// stand-in on the GPU, prints the evidence, each piece after the
// command that produced it, and tears the node down (-keep leaves it up).
// With -mode dra (MODE=dra) the node is moved to nvinject-dra by its label
// before the unchanged example vLLM Deployment runs, and the evidence adds the
// DeviceClass, the ResourceSlice and the pod's ResourceClaim; the node then has
// two SIMULATED A100s, and nvinject-dra, redeployed with
// deploy/components/dra-gpu-shares, runs the example GPU share
// (deploy/examples/dra/gpu-share-claim.yaml) on the other GPU, its limits
// read back from its MPS daemon inside the pod.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/e2e/harness/rig"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
)

type config struct {
	repo, bin, tools, runDir, layout string
	mode                             mode
	mig                              string
	keep                             bool
	nodes                            int
}

// migNodes are the SIMULATED node and what it publishes for each -mig: the
// example vLLM Deployment (nvidia.com/gpu: 1) lands on a MIG device under
// single and on the whole GPU 0 under mixed, beside the MIG resources.
var migNodes = map[string]rig.GPUs{
	"single": {NVML: "sim:a100-80gb,mig=0:1g.10gb*7", MIGStrategy: "single", Expect: map[string]int64{contract.ResourceName: 7}},
	"mixed": {NVML: "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb*2", All: true, MIGStrategy: "mixed", Expect: map[string]int64{
		contract.ResourceName: 1, contract.MIGResourceName(contract.ResourceName, "1g.10gb"): 2, contract.MIGResourceName(contract.ResourceName, "3g.40gb"): 1}},
}

// draNode is the SIMULATED node of -mode dra: two A100s, both published,
// so the vLLM pod's whole GPU and the example GPU share (showShare) sit
// side by side.
var draNode = rig.GPUs{NVML: "sim:a100-80gb*2", All: true, Expect: map[string]int64{contract.ResourceName: 2}}

// mode is who hands the node's GPU to kubelet: contract.DRAModeDevicePlugin
// or contract.DRAModeDRA, the values of the node label deploy/ schedules by.
type mode string

func (m *mode) String() string { return string(*m) }

func (m *mode) Set(v string) error {
	if v != contract.DRAModeDevicePlugin && v != contract.DRAModeDRA {
		return fmt.Errorf("use %s or %s", contract.DRAModeDevicePlugin, contract.DRAModeDRA)
	}
	*m = mode(v)
	return nil
}

func main() {
	c, err := parse(os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err != nil {
		os.Exit(cli.Code("demo", err, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, c, os.Stdout)
	stop()
	os.Exit(cli.Code("demo", err, os.Stderr))
}

// parse reads the command line and then the environment through getenv.
func parse(args []string, getenv func(string) string, stdout, stderr io.Writer) (config, error) {
	c := config{mode: contract.DRAModeDevicePlugin}
	cmd := cli.New("demo", "[flags]", cli.WithOutput(stdout, stderr), cli.WithAbout("make demo: a real single-node Kubernetes with a SIMULATED GPU, nvinject deployed the way an operator would, the vLLM stand-in, and the evidence with the commands that produced it (root)."))
	flag := cmd.Flags()
	flag.StringVar(&c.repo, "repo", ".", "nvinject checkout")
	flag.StringVar(&c.bin, "bin", "_out/equipment", "nvinject programs, their SIMULATION builds (`make equipment`)")
	flag.StringVar(&c.tools, "tools-bin", "", "pinned node programs (`make tools`; default $NVINJECT_TOOLS_BIN)")
	flag.StringVar(&c.runDir, "run-dir", "/tmp/nvinject-demo", "the node's run dir (keep it short: unix socket paths)")
	flag.BoolVar(&c.keep, "keep", false, "leave the node up (KEEP=1)")
	flag.StringVar(&c.layout, "driver-layout", "", "driver root on the node: flat (default) or debian for NVIDIA's REAL user space (make driver-root), simulated for the placeholder root (DRIVER_LAYOUT)")
	flag.StringVar(&c.mig, "mig", "none", "MIG on the SIMULATED node: none, single (an A100 split into seven 1g.10gb MIG devices, published as nvidia.com/gpu) or mixed (GPU 0 whole, GPU 1 as 3g.40gb + 2x1g.10gb) (MIG)")
	flag.IntVar(&c.nodes, "nodes", 1, "nodes: 1 (the one-node demo), or 2-3 for a fleet under one control plane, both paths side by side (NODES)")
	flag.Var(&c.mode, "mode", "who hands the GPU to kubelet: `"+contract.DRAModeDevicePlugin+"|"+contract.DRAModeDRA+"`; dra labels the node "+contract.DRAModeLabel+"="+contract.DRAModeDRA+" for nvinject-dra (MODE)")
	cmd.Env("tools-bin", "NVINJECT_TOOLS_BIN")
	cmd.Env("driver-layout", "DRIVER_LAYOUT")
	cmd.Env("mode", "MODE")
	cmd.Env("keep", "KEEP")
	cmd.Env("mig", "MIG")
	cmd.Env("nodes", "NODES")
	if err := cmd.Parse(args, getenv); err != nil {
		return config{}, err
	}
	if len(cmd.Args()) > 0 {
		return config{}, cli.Usagef("unexpected arguments %q; demo takes flags only", cmd.Args())
	}
	if _, ok := migNodes[c.mig]; !ok && c.mig != "none" {
		return config{}, cli.Usagef("-mig=%q: use none, single or mixed", c.mig)
	}
	if c.nodes < 1 || c.nodes > 3 {
		return config{}, cli.Usagef("-nodes=%d: use 1, 2 or 3", c.nodes)
	}
	if c.nodes > 1 && (c.mig != "none" || c.mode != contract.DRAModeDevicePlugin) {
		return config{}, cli.Usagef("-nodes=%d: the fleet sets each node's path itself (node 2 is DRA); leave MIG and MODE unset", c.nodes)
	}
	if c.mig != "none" && c.mode == contract.DRAModeDRA {
		return config{}, cli.Usagef("-mig=%s with -mode=dra: the demo shows MIG on the device plugin path; run MIG=%s with MODE=device-plugin", c.mig, c.mig)
	}
	return c, nil
}

// phases records how long each step took.
type phases struct {
	out   io.Writer
	names []string
	took  []time.Duration
}

func (p *phases) do(name string, f func() error) error {
	fmt.Fprintf(p.out, "\n### %s\n", name)
	t0 := time.Now()
	err := f()
	p.names, p.took = append(p.names, name), append(p.took, time.Since(t0))
	return err
}

func (p *phases) print(total time.Duration) {
	w := len("total")
	for _, n := range p.names {
		w = max(w, len(n))
	}
	fmt.Fprintf(p.out, "\n== timings ==\n")
	for i, n := range p.names {
		fmt.Fprintf(p.out, "  %-*s %9s\n", w, n, p.took[i].Round(10*time.Millisecond))
	}
	fmt.Fprintf(p.out, "  %-*s %9s\n", w, "total", total.Round(10*time.Millisecond))
}

func run(ctx context.Context, c config, out io.Writer) (err error) {
	for _, p := range []*string{&c.repo, &c.bin} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("resolve %s: %w", *p, err)
		}
		*p = abs
	}
	if c.tools == "" {
		return fmt.Errorf("no tools bin: run `make tools` and pass -tools-bin (or NVINJECT_TOOLS_BIN)")
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("the local node needs root (mounts, cgroups, runc)")
	}
	if err := rig.CheckNoOtherNode(c.runDir); err != nil {
		return err
	}
	if c.nodes > 1 {
		return runFleet(ctx, c, out)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	start := time.Now()
	p := &phases{out: out}
	fmt.Fprintln(out, "nvinject demo: a real single-node Kubernetes (kubelet, API server, containerd, runc) on this machine.")
	var drv rig.Driver
	if err := p.do("driver root (make driver-root, cached machine-wide)", func() (err error) {
		drv, err = rig.ChooseDriver(ctx, c.layout, os.Stderr)
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintln(out, "Driver root:", drv)
	fmt.Fprintln(out, "SIMULATED: the GPU. NVML is sim:a100-80gb (go-nvml's DGX A100 mock, deterministic UUIDs), its UUID query")
	fmt.Fprintln(out, "is nvidia-smi-sim; the vLLM server is a stand-in that does no inference.")

	node := kubelocal.New(kubelocal.WithRunDir(c.runDir), kubelocal.WithToolsBin(c.tools), kubelocal.WithLogger(log),
		kubelocal.WithContainerdDropIn(filepath.Join(c.repo, "deploy", "containerd", "nvinject.toml")),
		kubelocal.WithPauseBinary(filepath.Join(c.bin, "pause")), kubelocal.WithTimeout(2*time.Minute))
	var d *rig.Deployer
	defer func() {
		if c.keep {
			fmt.Fprintf(out, "\nThe node is still up (KEEP=1). Use it with:\n  %s --kubeconfig %s get pods -A\nTake it down with:\n  %s down -run-dir %s && umount %s && rm -r %s\n",
				filepath.Join(c.tools, "kubectl"), node.Kubeconfig(), filepath.Join(c.bin, "kubelocal"), c.runDir,
				rig.DriverRoot, rig.DriverRoot)
			p.print(time.Since(start))
			return
		}
		derr := p.do("tear down", func() error {
			var drain error
			if d != nil && c.mode == contract.DRAModeDRA {
				// kubelet unprepares the pod's claim through nvinject-dra: the
				// pod goes first, while the driver still runs (node.Down deletes
				// every pod at once and would wait for it in vain).
				drain = errors.Join(deleteShare(context.Background(), d, c.repo), d.DeleteVLLM(context.Background()))
			}
			return errors.Join(drain, node.Down(context.Background()), rig.RemoveDriverRoot())
		})
		if derr != nil && err == nil {
			err = fmt.Errorf("tear down (logs kept in %s/logs): %w", c.runDir, derr)
		}
		p.print(time.Since(start))
	}()
	if err := p.do("node up (etcd, API server, scheduler, controller-manager, containerd, kubelet)", func() error { return node.Up(ctx) }); err != nil {
		return err
	}
	d, err = rig.New(node, rig.WithRepoRoot(c.repo), rig.WithBinDir(c.bin), rig.WithToolsBin(c.tools), rig.WithLogger(log), rig.WithDriver(drv))
	if err != nil {
		return err
	}
	if err := p.do("images (OCI archives, imported into containerd)", func() error {
		if err := d.ImportImages(ctx); err != nil || c.mode != contract.DRAModeDRA {
			return err
		}
		return d.ImportDRAImage(ctx)
	}); err != nil {
		return err
	}
	var dep rig.Deployment
	if err := p.do("deploy nvinject (kubectl apply -k, DaemonSets Ready, GPU published)", func() (err error) {
		g := rig.GPUs{NVML: rig.DefaultNVML}
		if m, ok := migNodes[c.mig]; ok {
			g = m
		}
		if c.mode == contract.DRAModeDRA {
			g = draNode
		}
		dep, err = d.Deploy(ctx, g)
		return err
	}); err != nil {
		return err
	}
	selected := dep.UUID
	if dep.All {
		selected = "all (" + dep.NVML + ")"
	}
	fmt.Fprintf(out, "  applied %s/kustomization.yaml (base deploy/overlays/local-sim); selected GPU %s\n", dep.Kustomization, selected)
	var own owner = devicePlugin{}
	if c.mode == contract.DRAModeDRA {
		own = draDriver{}
		if err := p.do("switch the node to DRA (kubectl label node, nvinject-dra Ready)", func() error {
			sw, err := d.SwitchToDRA(ctx, dep, 3*time.Minute)
			if err != nil {
				return err
			}
			r := func(t time.Duration) time.Duration { return t.Round(10 * time.Millisecond) }
			fmt.Fprintf(out, "  applied deploy/components/local-sim-dra, labeled node %s %s=%s; after the label:\n", node.Name(), contract.DRAModeLabel, contract.DRAModeDRA)
			fmt.Fprintf(out, "  device plugin pod gone %s, nvinject-dra Ready with its ResourceSlice %s, allocatable %s 0 %s (capacity then %d)\n",
				r(sw.OldOwnerGone), r(sw.Ready), contract.ResourceName, r(sw.Allocatable), sw.Capacity)
			return nil
		}); err != nil {
			return err
		}
	}
	var pod *corev1.Pod
	if err := p.do("vLLM stand-in (kubectl apply -k e2e/harness/rig/vllm, pod Ready)", func() (err error) {
		pod, err = d.RunVLLM(ctx, 3*time.Minute)
		return err
	}); err != nil {
		return err
	}
	return p.do("evidence", func() error {
		e := evidence{d: d, dep: dep, pod: pod, sh: shell{out: out}}
		if err := e.show(ctx, own); err != nil {
			return err
		}
		if c.mode == contract.DRAModeDRA {
			return e.showShare(ctx, c.repo)
		}
		if c.mig == "none" {
			return nil
		}
		return e.showMIG(ctx)
	})
}
