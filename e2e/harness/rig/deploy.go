package rig

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
)

// GPUs says what the simulated node has and which GPU it publishes.
type GPUs struct {
	// NVML is the simulated node, sim:a100-80gb or sim:a100-80gb*N.
	NVML string
	// Selected is the index (host nvidia-smi) of the one GPU published
	// (with All, the GPU whose health WaitReady checks).
	Selected int
	// All publishes every GPU: the ConfigMap's selection is "all".
	All bool
	// IDStrategy is the device plugin's DEVICE_ID_STRATEGY: "" keeps the
	// overlay's uuid, "index" makes kubelet see GPU indices.
	IDStrategy string
	// MIGStrategy is the device plugin's MIG_STRATEGY: "" keeps none.
	MIGStrategy string
	// Sharing is the device plugin's time-slicing configuration (the
	// ConfigMap nvinject-sharing); "" shares nothing.
	Sharing string
	// Expect is what the Node must publish, by resource, once Ready
	// (default: one nvidia.com/gpu).
	Expect map[string]int64
}

// expected is what g's Node publishes once Ready.
func (g GPUs) expected() map[string]int64 {
	if g.Expect != nil {
		return g.Expect
	}
	return map[string]int64{Resource: 1}
}

// Deployment is what Deploy installed.
type Deployment struct {
	GPUs
	// UUID is the selected GPU's UUID, from the host's nvidia-smi.
	UUID string
	// DeviceID is the ID kubelet sees for it: the UUID, or its index.
	DeviceID string
	// Kustomization is the directory applied with kubectl apply -k.
	Kustomization string
}

// Deploy writes the driver root for g, gives the host g's device nodes, applies nvinject with the selected GPU
// and waits until both DaemonSets are Ready and the node publishes one GPU.
func (d *Deployer) Deploy(ctx context.Context, g GPUs) (Deployment, error) {
	if g.NVML == "" {
		g.NVML = DefaultNVML
	}
	if err := d.WriteDriverRoot(ctx, g.NVML); err != nil {
		return Deployment{}, err
	}
	gpus, err := d.HostGPUs(ctx)
	if err != nil {
		return Deployment{}, err
	}
	if g.Selected < 0 || g.Selected >= len(gpus) {
		return Deployment{}, fmt.Errorf("select GPU %d: the simulated host (%s) has %d GPUs", g.Selected, g.NVML, len(gpus))
	}
	caps, err := MIGHostDevices(ctx, g.NVML)
	if err != nil {
		return Deployment{}, err
	}
	if err := d.node.SetHostDevices(append(HostDevices(len(gpus)), caps...)); err != nil {
		return Deployment{}, fmt.Errorf("give the host the device nodes of %d simulated GPUs: %w", len(gpus), err)
	}
	dep := Deployment{GPUs: g, UUID: gpus[g.Selected].UUID, DeviceID: gpus[g.Selected].UUID, Kustomization: filepath.Join(d.node.RunDir(), "deploy", "nvinject")}
	switch g.IDStrategy {
	case "", "uuid":
	case "index":
		dep.DeviceID = strconv.Itoa(g.Selected)
	default:
		return Deployment{}, fmt.Errorf("device ID strategy %q: use uuid or index", g.IDStrategy)
	}
	if err := d.writeKustomization(dep); err != nil {
		return Deployment{}, err
	}
	if dep.Sharing == "" {
		// apply -k prunes nothing: an earlier deployment's sharing goes here.
		if _, err := d.kube.Kubectl(ctx, "", "-n", Namespace, "delete", "configmap", SharingConfigMap, "--ignore-not-found"); err != nil {
			return Deployment{}, fmt.Errorf("remove the sharing ConfigMap of an earlier deployment: %w", err)
		}
	}
	if _, err := d.kube.Kubectl(ctx, "", "apply", "-k", dep.Kustomization); err != nil {
		return Deployment{}, fmt.Errorf("apply nvinject (%s): %w", dep.Kustomization, err)
	}
	d.log.Info("nvinject applied", "kustomization", dep.Kustomization, "nvml", g.NVML, "selected", dep.UUID)
	if err := d.WaitReady(ctx, dep, 3*time.Minute); err != nil {
		return Deployment{}, err
	}
	return dep, nil
}

// writeKustomization writes the local node's overlay of deploy/overlays/local-sim:
// the node's own NRI socket, CDI dir and pod-resources dir, the API server's
// address (the device plugin's labels, nvinject-nri's Events), the selected
// GPU and, for a bigger simulated node, its NVML.
func (d *Deployer) writeKustomization(dep Deployment) error {
	// kustomize takes bases only by relative path.
	base, err := filepath.Rel(dep.Kustomization, filepath.Join(d.repo, "deploy", "overlays", "local-sim"))
	if err != nil {
		return fmt.Errorf("locate deploy/overlays/local-sim from %s: %w", dep.Kustomization, err)
	}
	apiHost, apiPort := d.node.APIServerAddress()
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by e2e/harness/rig: deploy/overlays/local-sim on the local node %s.
# Only the node's layout (run dir %s) and the selected GPU differ.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
patches:
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: %s, namespace: %s}
      spec:
        template:
          spec:
            # The GPU labels reach the API server on the node's loopback,
            # as nvinject-nri's audit Events do (below).
            hostNetwork: true
            containers:
              - name: device-plugin
                env:
                  - {name: KUBERNETES_SERVICE_HOST, value: "%s"}
                  - {name: KUBERNETES_SERVICE_PORT, value: "%s"}
            volumes:
              - name: cdi-specs
                hostPath: {path: %s, type: DirectoryOrCreate}
              - name: state
                hostPath: {path: %s, type: DirectoryOrCreate}
              - name: pod-resources
                hostPath: {path: %s, type: Directory}
              - name: mps
                hostPath: {path: %s, type: DirectoryOrCreate}
              - name: mps-shm
                hostPath: {path: %s/shm, type: DirectoryOrCreate}
  # The MPS clients' mounts name the MPS directory's host path.
  - target: {kind: DaemonSet, name: %s}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/args/10, value: "--host-mps-dir=%s"}
      - {op: replace, path: /spec/template/spec/containers/0/args/10, value: "--host-mps-dir=%s"}
  # No kube-proxy here: nvinject-nri reaches the API server (its audit
  # Events) on the node's loopback, as nvinject-dra does
  # (deploy/components/local-sim-dra), with its in-cluster token and CA.
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: %s, namespace: %s}
      spec:
        template:
          spec:
            hostNetwork: true
            containers:
              - name: nri
                env:
                  - {name: KUBERNETES_SERVICE_HOST, value: "%s"}
                  - {name: KUBERNETES_SERVICE_PORT, value: "%s"}
            volumes:
              - name: nri-socket
                hostPath: {path: %s, type: Directory}
              - name: cdi-specs
                hostPath: {path: %s, type: DirectoryOrCreate}
              - name: pod-resources
                hostPath: {path: %s, type: Directory}
  - patch: |-
      apiVersion: v1
      kind: ConfigMap
      metadata: {name: %s, namespace: %s}
      data: {selected-gpu-uuid: %s}
`, d.node.Name(), d.node.RunDir(), base,
		DevicePlugin, Namespace, apiHost, strconv.Itoa(apiPort), d.node.CDIDir(), d.StateDir(), d.node.PodResourcesDir(), d.MPSDir(), d.MPSDir(),
		DevicePlugin, contract.MPSDir, d.MPSDir(),
		NRIPlugin, Namespace, apiHost, strconv.Itoa(apiPort), filepath.Dir(d.node.NRISocket()), d.node.CDIDir(), d.node.PodResourcesDir(),
		DevicePlugin, Namespace, dep.selection())
	if dep.NVML != DefaultNVML {
		// Both daemons read the same simulated inventory; the test ops fail the
		// build if local-sim's argument order changes.
		fmt.Fprintf(&b, `  - target: {kind: DaemonSet, name: %s}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/args/0, value: "--nvml=%s"}
      - {op: replace, path: /spec/template/spec/containers/0/args/0, value: "--nvml=%s"}
  - target: {kind: DaemonSet, name: %s}
    patch: |-
      - {op: test, path: /spec/template/spec/containers/0/args/8, value: "--nvml=%s"}
      - {op: replace, path: /spec/template/spec/containers/0/args/8, value: "--nvml=%s"}
`, DevicePlugin, DefaultNVML, dep.NVML, NRIPlugin, DefaultNVML, dep.NVML)
	}
	if dep.Sharing != "" {
		// The plugin reads the file at start: the hash rolls it on a change.
		sum := sha256.Sum256([]byte(dep.Sharing))
		fmt.Fprintf(&b, `  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: %s, namespace: %s}
      spec:
        template:
          metadata:
            annotations: {nvinject.io/sharing-config: "%x"}
`, DevicePlugin, Namespace, sum[:8])
	}
	if dep.MIGStrategy != "" {
		devicePluginEnv(&b, "MIG_STRATEGY", dep.MIGStrategy)
	}
	if dep.IDStrategy == "index" {
		devicePluginEnv(&b, "DEVICE_ID_STRATEGY", "index")
	}
	if dep.Sharing != "" {
		fmt.Fprintf(&b, `configMapGenerator:
  - name: %s
    namespace: %s
    options: {disableNameSuffixHash: true}
    literals:
      - |-
        config.yaml=%s
`, SharingConfigMap, Namespace, strings.ReplaceAll(dep.Sharing, "\n", "\n        "))
	}
	if err := os.MkdirAll(dep.Kustomization, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dep.Kustomization, err)
	}
	path := filepath.Join(dep.Kustomization, "kustomization.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// devicePluginEnv patches the device plugin's container to set name=value.
func devicePluginEnv(b *strings.Builder, name, value string) {
	fmt.Fprintf(b, `  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: %s, namespace: %s}
      spec:
        template:
          spec:
            containers:
              - name: device-plugin
                env:
                  - {name: %s, value: %s}
`, DevicePlugin, Namespace, name, value)
}

// selection is the ConfigMap's selected-gpu-uuid.
func (dep Deployment) selection() string {
	if dep.All {
		return "all"
	}
	return dep.UUID
}

// StateDir is the device plugin's --state-dir (its health checkpoint) on
// this node: under the node's run dir, so no checkpoint outlives the node.
func (d *Deployer) StateDir() string { return filepath.Join(d.node.RunDir(), "dp-state") }

// MPSDir is the host directory of the device plugin's MPS control daemons
// on this node: under the node's run dir, short enough for their sockets.
func (d *Deployer) MPSDir() string { return filepath.Join(d.node.RunDir(), "mps") }
