package rig

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
)

// TestKustomizationPatchesOnlyTheNodeLayout builds the written kustomization
// with the pinned kubectl and checks the node's paths, the selected GPU and
// the 8-GPU NVML land on the right objects.
func TestKustomizationPatchesOnlyTheNodeLayout(t *testing.T) {
	d, run := kustomizeDeployer(t)
	node := d.node
	const uuid = "GPU-00000000-0000-0000-0000-000000000005"
	dep := Deployment{GPUs: GPUs{NVML: "sim:a100-80gb*8", Selected: 5}, UUID: uuid, Kustomization: filepath.Join(run, "deploy", "nvinject")}
	y := d.render(t, dep)
	for _, want := range []string{
		"selected-gpu-uuid: " + uuid,
		"path: " + node.CDIDir(),
		"path: " + filepath.Dir(node.NRISocket()),
		"path: " + node.PodResourcesDir(),
		"path: " + DriverRoot,
		"path: /var/lib/kubelet/device-plugins",
		"path: " + d.StateDir(),
		"image: ghcr.io/nvinject/nvinject-device-plugin:v",
		"image: ghcr.io/nvinject/nvinject-nri:v",
		"imagePullPolicy: Never",
		// nvinject-nri's audit Events reach the API server on loopback.
		"hostNetwork: true",
		"name: KUBERNETES_SERVICE_HOST\n          value: 127.0.0.1",
		"name: KUBERNETES_SERVICE_PORT\n          value: \"16443\"",
	} {
		if !strings.Contains(y, want) {
			t.Errorf("rendered kustomization lacks %q", want)
		}
	}
	if n := strings.Count(y, "--nvml=sim:a100-80gb*8"); n != 2 {
		t.Errorf("--nvml=sim:a100-80gb*8 appears %d times, want once per DaemonSet", n)
	}
	if strings.Contains(y, "path: /var/run/nri") || strings.Contains(y, "path: /var/run/cdi") || strings.Contains(y, "path: /var/lib/kubelet/pod-resources") || strings.Contains(y, "path: /var/lib/nvinject/device-plugin") {
		t.Errorf("host paths of a real node remain:\n%s", y)
	}
}

// MIG strategy and time-slicing land on the device plugin: its env, the
// sharing ConfigMap (the file it reads) and the template annotation that
// rolls it when the configuration changes.
func TestKustomizationMIGAndSharing(t *testing.T) {
	d, run := kustomizeDeployer(t)
	sharing := "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}"
	dep := Deployment{GPUs: GPUs{NVML: "sim:a100-80gb*2,mig=1:1g.10gb*7", All: true, MIGStrategy: "mixed", Sharing: sharing},
		UUID: "GPU-x", Kustomization: filepath.Join(run, "deploy", "nvinject")}
	y := d.render(t, dep)
	for _, want := range []string{"selected-gpu-uuid: all", "value: mixed", "name: " + SharingConfigMap, "replicas: 4", "nvinject.io/sharing-config:", "--nvml=sim:a100-80gb*2,mig=1:1g.10gb*7"} {
		if !strings.Contains(y, want) {
			t.Errorf("rendered kustomization lacks %q:\n%s", want, y)
		}
	}
}

// kustomizeDeployer is a Deployer on a local node's layout in a fresh run
// dir, enough to write and render its kustomization.
func kustomizeDeployer(t *testing.T) (*Deployer, string) {
	t.Helper()
	if os.Getenv("NVINJECT_TOOLS_BIN") == "" {
		t.Skip("NVINJECT_TOOLS_BIN is unset: run `make tools` to build kubectl")
	}
	repo, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	run := t.TempDir()
	return &Deployer{node: kubelocal.New(kubelocal.WithRunDir(run)), repo: repo}, run
}

// render writes dep's kustomization and builds it with the pinned kubectl.
func (d *Deployer) render(t *testing.T, dep Deployment) string {
	t.Helper()
	if err := d.writeKustomization(dep); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(os.Getenv("NVINJECT_TOOLS_BIN"), "kubectl"), "kustomize", dep.Kustomization).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	return string(out)
}
