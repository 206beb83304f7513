package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nvinject/nvinject/e2e/harness/driverroot"
	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

// runFleet is make demo NODES=N: N real nodes under one control plane, both paths
// side by side (rig.DemoFleet), and the example vLLM Deployment at two replicas a
// node, each pod's GPU checked inside it against its own node's GPUs.
func runFleet(ctx context.Context, c config, out io.Writer) (err error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	start := time.Now()
	p := &phases{out: out}
	sh := shell{out: out}
	fleet := rig.DemoFleet(kubelocal.DefaultNodeName, c.nodes)
	fmt.Fprintf(out, "nvinject fleet demo: %d real nodes (each its own containerd, kubelet, network and mount namespaces) under one control plane.\n", len(fleet))
	fmt.Fprintln(out, "SIMULATED: the GPUs (go-nvml's DGX A100 and H100 mocks); the vLLM server is a stand-in that does no inference.")
	var drv rig.Driver
	if err := p.do("driver root (make driver-root, cached machine-wide)", func() (err error) {
		drv, err = rig.ChooseDriver(ctx, c.layout, os.Stderr)
		if err != nil || len(fleet) < 3 || !drv.Real() {
			return err
		}
		// The third node runs the other real driver: both versions side by side.
		fleet[2].Driver, err = rig.ChooseDriverVersion(ctx, driverroot.DriverVersion550, drv.Layout, os.Stderr)
		return err
	}); err != nil {
		return err
	}
	var workers []string
	for _, n := range fleet[1:] {
		workers = append(workers, n.Name)
	}
	node := kubelocal.New(kubelocal.WithRunDir(c.runDir), kubelocal.WithToolsBin(c.tools), kubelocal.WithLogger(log),
		kubelocal.WithContainerdDropIn(filepath.Join(c.repo, "deploy", "containerd", "nvinject.toml")),
		kubelocal.WithPauseBinary(filepath.Join(c.bin, "pause")), kubelocal.WithTimeout(2*time.Minute),
		kubelocal.WithWorkers(workers...), kubelocal.WithNodeLocalDirs(rig.FleetNodeLocalDirs()...))
	var d *rig.Deployer
	defer func() {
		if c.keep {
			fmt.Fprintf(out, "\nThe fleet is still up (KEEP=1): %s --kubeconfig %s get nodes\nTake it down with: %s down -run-dir %s\n",
				filepath.Join(c.tools, "kubectl"), node.Kubeconfig(), filepath.Join(c.bin, "kubelocal"), c.runDir)
			p.print(time.Since(start))
			return
		}
		derr := p.do("tear down", func() error {
			var drain error
			if d != nil {
				drain = d.DeleteVLLM(context.Background())
			}
			return errors.Join(drain, node.Down(context.Background()), rig.RemoveDriverRoot())
		})
		if derr != nil && err == nil {
			err = fmt.Errorf("tear down (logs kept in %s/logs and %s/nodes/*/logs): %w", c.runDir, c.runDir, derr)
		}
		p.print(time.Since(start))
	}()
	if err := p.do(fmt.Sprintf("%d nodes up (one control plane; containerd and kubelet per node)", len(fleet)), func() error { return node.Up(ctx) }); err != nil {
		return err
	}
	d, err = rig.New(node, rig.WithRepoRoot(c.repo), rig.WithBinDir(c.bin), rig.WithToolsBin(c.tools), rig.WithLogger(log), rig.WithDriver(drv))
	if err != nil {
		return err
	}
	if err := p.do("images (imported into every node's containerd)", func() error { return d.ImportImages(ctx) }); err != nil {
		return err
	}
	if err := p.do("deploy nvinject (one set of DaemonSets; every node publishes its 8 GPUs)", func() error {
		_, err := d.DeployFleet(ctx, fleet, 4*time.Minute)
		return err
	}); err != nil {
		return err
	}
	kubectl := d.Kube().KubectlArgs
	if err := p.do("the fleet", func() error {
		if _, err := sh.run(ctx, kubectl("get", "nodes", "-L", contract.DRAModeLabel+","+contract.GFDLabelProduct+","+contract.GFDLabelCount+","+contract.GFDLabelDriverVersion)...); err != nil {
			return err
		}
		if _, err := sh.run(ctx, kubectl("get", "resourceslices", "-o", "custom-columns=NODE:.spec.nodeName,DRIVER:.spec.driver,DEVICES:.spec.devices[*].name")...); err != nil {
			return err
		}
		// The fleet doctor, as an operator runs it: one row per GPU node, from the API alone.
		_, err := sh.run(ctx, d.Bin("nvinject-doctor"), "--all-nodes", "--kubeconfig", d.Kube().Kubeconfig)
		return err
	}); err != nil {
		return err
	}
	return p.do(fmt.Sprintf("vLLM stand-in at %d replicas, each pod's GPU checked inside it", 2*len(fleet)), func() error {
		pods, err := d.RunVLLMReplicas(ctx, 2*len(fleet), 3*time.Minute)
		if err != nil {
			return err
		}
		owner := map[string]string{}
		for _, n := range fleet {
			g, err := rig.SimulatedGPUs(ctx, n.NVML)
			if err != nil {
				return err
			}
			for _, dev := range g.Devices {
				owner[dev.UUID] = n.Name
			}
		}
		seen := map[string]string{}
		for _, pod := range pods {
			env, err := d.Kube().Exec(ctx, pod.Namespace, pod.Name, "", "env")
			if err != nil {
				return fmt.Errorf("env in %s: %w", pod.Name, err)
			}
			var uuid string
			for _, l := range strings.Split(env, "\n") {
				if k, v, ok := strings.Cut(l, "="); ok && strings.HasPrefix(k, "NVINJECT_GPU_UUID_") {
					uuid = v
				}
			}
			if owner[uuid] != pod.Spec.NodeName {
				return fmt.Errorf("pod %s on %s holds %q, which is %q's GPU", pod.Name, pod.Spec.NodeName, uuid, owner[uuid])
			}
			if other, dup := seen[uuid]; dup {
				return fmt.Errorf("pods %s and %s both hold %s", other, pod.Name, uuid)
			}
			seen[uuid] = pod.Name
			reply, err := rig.Complete(ctx, pod.Status.PodIP)
			if err != nil {
				return fmt.Errorf("completion from %s: %w", pod.Name, err)
			}
			// The driver user space the pod was given, from the real nvidia-smi's banner.
			smi, _ := d.Kube().Exec(ctx, pod.Namespace, pod.Name, "", "/bin/sh", "-c", "nvidia-smi -h | head -1")
			driver, ok := driverroot.SMIVersionLine(smi)
			if !ok {
				driver = "SIMULATED root (nvidia-smi-sim)"
			}
			sh.note("%s on %s (pod IP %s): GPU %s, its node's own; driver %s; /v1/completions answered %d bytes", pod.Name, pod.Spec.NodeName, pod.Status.PodIP, uuid, driver, len(reply))
		}
		return nil
	})
}
