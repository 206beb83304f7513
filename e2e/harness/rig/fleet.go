package rig

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// FleetNode is one GPU node of a fleet on the local cluster (kubelocal.WithWorkers).
type FleetNode struct {
	// Name is the Kubernetes node: the first node's or a worker's.
	Name string
	// NVML is its SIMULATED GPUs, such as sim:a100-80gb*8.
	NVML string
	// Mode is who owns its GPUs: contract.DRAModeDevicePlugin or contract.DRAModeDRA.
	Mode string
	// Driver is its driver root; the zero value is the Deployer's.
	Driver Driver
}

// DriverOf is the driver root node n gets: its own, else the Deployer's.
func (d *Deployer) DriverOf(n FleetNode) Driver {
	if n.Driver.Layout != "" {
		return n.Driver
	}
	return d.driver
}

// GPUPresentLabel is the label nvinject's DaemonSets select GPU nodes by (deploy/base).
const GPUPresentLabel = "nvidia.com/gpu.present"

// FleetNodeLocalDirs are the host dirs every worker of a fleet has its own copy of
// (kubelocal.WithNodeLocalDirs) beside its run-dir paths: the driver root.
func FleetNodeLocalDirs() []string { return []string{DriverRoot} }

// DriverRootOf is where node's driver root is on the host.
func (d *Deployer) DriverRootOf(node string) string {
	if w := d.worker(node); w != nil {
		return w.HostPath(DriverRoot)
	}
	return DriverRoot
}

func (d *Deployer) worker(node string) *kubelocal.Worker {
	for _, w := range d.node.Workers() {
		if w.Name() == node {
			return w
		}
	}
	return nil
}

// DeployFleet writes each node's driver root (its own GPUs, named for
// --nvml=sim:driver-root, and its own driver), labels each node with its mode, applies
// one set of nvinject's DaemonSets for every node (the device plugin's and nvinject-dra,
// each selecting its nodes by the mode label) and waits until every node publishes all
// its GPUs: as Node allocatable on device-plugin nodes, as ResourceSlice devices on DRA
// nodes.
func (d *Deployer) DeployFleet(ctx context.Context, nodes []FleetNode, timeout time.Duration) (Deployment, error) {
	dra := filepath.Join(d.repo, SimImagesDir, "nvinject-dra.oci.tar")
	if err := d.importEverywhere(ctx, dra); err != nil {
		return Deployment{}, fmt.Errorf("%w; run `make sim-images`", err)
	}
	most := 0
	for _, n := range nodes {
		drv := d.DriverOf(n)
		dir := d.DriverRootOf(n.Name)
		if err := d.writeDriverRootAt(ctx, dir, n.NVML, drv); err != nil {
			return Deployment{}, fmt.Errorf("driver root of %s: %w", n.Name, err)
		}
		if dir == DriverRoot {
			if err := shareDriverRoot(); err != nil {
				return Deployment{}, err
			}
		}
		g, err := SimulatedGPUs(ctx, n.NVML)
		if err != nil {
			return Deployment{}, err
		}
		most = max(most, len(g.Devices))
		mode := n.Mode
		if mode == "" {
			mode = contract.DRAModeDevicePlugin
		}
		if _, err := d.kube.Kubectl(ctx, "", "label", "node", n.Name, "--overwrite",
			GPUPresentLabel+"=true", contract.DRAModeLabel+"="+mode); err != nil {
			return Deployment{}, err
		}
	}
	// Every node's /dev is the host's here: the device nodes of the biggest node serve all.
	if err := d.node.SetHostDevices(HostDevices(most)); err != nil {
		return Deployment{}, fmt.Errorf("give the host the device nodes of %d simulated GPUs: %w", most, err)
	}
	dep := Deployment{GPUs: GPUs{NVML: sim.FromDriverRoot, All: true},
		Kustomization: filepath.Join(d.node.RunDir(), "deploy", "nvinject")}
	if err := d.writeKustomization(dep); err != nil {
		return Deployment{}, err
	}
	draDir, err := d.draKustomization(dep)
	if err != nil {
		return Deployment{}, err
	}
	fleet, err := d.writeFleetKustomization(draDir)
	if err != nil {
		return Deployment{}, err
	}
	if _, err := d.kube.Kubectl(ctx, "", "apply", "-k", fleet); err != nil {
		return Deployment{}, fmt.Errorf("apply nvinject to the fleet (%s): %w", fleet, err)
	}
	dep.Kustomization = fleet
	d.log.Info("nvinject applied to the fleet", "kustomization", fleet, "nodes", len(nodes))
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, n := range nodes {
		if err := Poll(wctx, 500*time.Millisecond, func(ctx context.Context) error { return d.FleetNodePublished(ctx, n) }); err != nil {
			return Deployment{}, fmt.Errorf("node %s (%s, %s) did not publish its GPUs: %w; see `kubectl -n %s get pods -o wide` and the owner's log", n.Name, n.Mode, n.NVML, err, Namespace)
		}
	}
	for _, ds := range []string{DevicePlugin, NRIPlugin, DRADaemonSet} {
		if err := Poll(wctx, 500*time.Millisecond, func(ctx context.Context) error { return d.daemonSetReady(ctx, ds) }); err != nil {
			return Deployment{}, fmt.Errorf("DaemonSet %s/%s not Ready: %w", Namespace, ds, err)
		}
	}
	return dep, nil
}

// FleetNodePublished returns nil once n's owner publishes all of n's GPUs, healthy, and
// the other path publishes none.
func (d *Deployer) FleetNodePublished(ctx context.Context, n FleetNode) error {
	g, err := SimulatedGPUs(ctx, n.NVML)
	if err != nil {
		return err
	}
	want := int64(len(g.Devices))
	node, err := d.kube.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	alloc := node.Status.Allocatable[corev1.ResourceName(Resource)]
	slices, err := d.NodeSliceDevices(ctx, n.Name)
	if err != nil {
		return err
	}
	if n.Mode == contract.DRAModeDRA {
		healthy := 0
		for _, dev := range slices {
			if len(dev.Taints) == 0 {
				healthy++
			}
		}
		if int64(healthy) != want || alloc.Value() != 0 {
			return fmt.Errorf("%d of %d devices untainted in ResourceSlices, allocatable %s %d (want 0)", healthy, want, Resource, alloc.Value())
		}
		return nil
	}
	if alloc.Value() != want || len(slices) != 0 {
		return fmt.Errorf("allocatable %s %d of %d, %d ResourceSlice devices (want 0)", Resource, alloc.Value(), want, len(slices))
	}
	return nil
}

// NodeSliceDevices are the devices nvinject-dra publishes for node.
func (d *Deployer) NodeSliceDevices(ctx context.Context, node string) ([]resourceapi.Device, error) {
	list, err := d.kube.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node + "," + resourceapi.ResourceSliceSelectorDriver + "=" + contract.DRADriver})
	if err != nil {
		return nil, err
	}
	var out []resourceapi.Device
	for _, s := range list.Items {
		out = append(out, s.Spec.Devices...)
	}
	return out, nil
}

// writeFleetKustomization is the DRA kustomization (both DaemonSets) for a fleet:
// every DaemonSet selects the GPU nodes rather than the first node, nvinject-dra also
// by its mode, and nvinject-dra reaches the API server where the nodes' namespaces do.
func (d *Deployer) writeFleetKustomization(dra string) (string, error) {
	dir := filepath.Join(d.node.RunDir(), "deploy", "nvinject-fleet")
	base, err := filepath.Rel(dir, dra)
	if err != nil {
		return "", err
	}
	host, port := d.node.APIServerAddress()
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by e2e/harness/rig: nvinject on every GPU node of the local fleet.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
patches:
`, base)
	for _, ds := range []string{DevicePlugin, NRIPlugin} {
		fmt.Fprintf(&b, `  - target: {kind: DaemonSet, name: %s}
    patch: |-
      - {op: replace, path: /spec/template/spec/nodeSelector, value: {%s: "true"}}
`, ds, GPUPresentLabel)
	}
	fmt.Fprintf(&b, `  - target: {kind: DaemonSet, name: %s}
    patch: |-
      - {op: replace, path: /spec/template/spec/nodeSelector, value: {%s: "true", %s: %s}}
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: %s, namespace: %s}
      spec:
        template:
          spec:
            containers:
              - name: dra
                env:
                  - {name: KUBERNETES_SERVICE_HOST, value: "%s"}
                  - {name: KUBERNETES_SERVICE_PORT, value: "%d"}
`, DRADaemonSet, GPUPresentLabel, contract.DRAModeLabel, contract.DRAModeDRA, DRADaemonSet, Namespace, host, port)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644)
}

// FleetSimDebug POSTs to the simulation-only /debug/sim/<action> of the owner of
// node's GPUs (the device plugin's or nvinject-dra's pod on that node).
func (d *Deployer) FleetSimDebug(ctx context.Context, n FleetNode, action, query string) error {
	ds, port := DevicePlugin, DevicePluginMetricsPort
	if n.Mode == contract.DRAModeDRA {
		ds, port = DRADaemonSet, contract.DRAMetricsPort
	}
	pods, err := d.kube.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=" + ds, FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return err
	}
	if len(pods.Items) != 1 || pods.Items[0].Status.PodIP == "" {
		return fmt.Errorf("%s on %s: %d pods, want one with an IP", ds, n.Name, len(pods.Items))
	}
	_, err = httpDo(ctx, "POST", fmt.Sprintf("http://%s:%d/debug/sim/%s?%s", pods.Items[0].Status.PodIP, port, action, query))
	return err
}

// DemoFleet is the local fleet of n nodes (2 or 3) the demo and the fleet scenarios
// run: node 1 the device plugin on 8 A100-80GB, node 2 nvinject-dra on 8 H100-80GB
// (go-nvml's DGX H100 GPUs), node 3 the device plugin on 8 A100-80GB. Names are
// first's, then first-2, first-3; every node's GPUs have UUIDs of their own.
func DemoFleet(first string, n int) []FleetNode {
	out := []FleetNode{
		{Name: first, NVML: "sim:a100-80gb*8,host=" + first, Mode: contract.DRAModeDevicePlugin},
		{Name: first + "-2", NVML: "sim:h100-80gb*8,host=" + first + "-2", Mode: contract.DRAModeDRA},
		{Name: first + "-3", NVML: "sim:a100-80gb*8,host=" + first + "-3", Mode: contract.DRAModeDevicePlugin},
	}
	return out[:min(max(n, 1), len(out))]
}

// RunVLLMReplicas applies the vLLM stand-in scaled to replicas and returns its pods
// once all are Ready.
func (d *Deployer) RunVLLMReplicas(ctx context.Context, replicas int, timeout time.Duration) ([]corev1.Pod, error) {
	if _, err := d.kube.Kubectl(ctx, "", "apply", "-k", d.VLLMKustomization()); err != nil {
		return nil, fmt.Errorf("apply the vLLM stand-in: %w", err)
	}
	if _, err := d.kube.Kubectl(ctx, "", "-n", "default", "scale", "deployment/vllm-demo", fmt.Sprintf("--replicas=%d", replicas)); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var ready []corev1.Pod
	err := Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		pods, err := d.kube.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: VLLMSelector})
		if err != nil {
			return err
		}
		ready = ready[:0]
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					ready = append(ready, p)
				}
			}
		}
		if len(ready) != replicas {
			return fmt.Errorf("%d of %d vLLM pods Ready (%s)", len(ready), replicas, podStates(pods.Items))
		}
		return nil
	})
	return ready, err
}
