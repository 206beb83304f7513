package scenarios

import (
	"path/filepath"
	"strings"
	"testing"
)

// Every Kustomize tree in deploy/ must pass the real API server's
// validation (schemas, defaulting, admission), not just a client-side
// decode.
func TestManifestsPassServerDryRun(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"deploy", "deploy/overlays/nvkind-worker", "deploy/overlays/multi-gpu", "deploy/overlays/cdi-only-node", "deploy/overlays/local-sim", "deploy/examples/vllm"} {
		t.Run(dir, func(t *testing.T) {
			out, err := d.Kube().Kubectl(ctx, "", "apply", "--dry-run=server", "-k", filepath.Join(repo, dir))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "(server dry run)") {
				t.Fatalf("no server dry run reported:\n%s", out)
			}
		})
	}
	if _, err := d.Kube().Kubectl(ctx, "", "apply", "--dry-run=server", "-f", filepath.Join(repo, "deploy/examples/gpu-check-pod.yaml")); err != nil {
		t.Fatal(err)
	}
}

// The admission policy is the first half of failing closed: an nvidia pod
// without the required-plugins annotation never reaches containerd.
func TestAdmissionPolicyRequiresNRIAnnotation(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	pod := func(annotations string) string {
		return `apiVersion: v1
kind: Pod
metadata:
  name: policy-probe
  namespace: default
` + annotations + `spec:
  runtimeClassName: nvidia
  containers:
  - name: main
    image: nvinject.local/busybox:dev
    command: ["true"]
`
	}
	out, err := d.Kube().Kubectl(ctx, pod(""), "apply", "--dry-run=server", "-f", "-")
	if err == nil || !strings.Contains(out, "nvinject-require-nri-plugin") || !strings.Contains(out, "required-plugins.noderesource.dev/pod") {
		t.Fatalf("an nvidia pod without the annotation was not denied by the policy: %v\n%s", err, out)
	}
	ok := "  annotations:\n    required-plugins.noderesource.dev/pod: '[\"nvinject\"]'\n"
	if out, err := d.Kube().Kubectl(ctx, pod(ok), "apply", "--dry-run=server", "-f", "-"); err != nil {
		t.Fatalf("an annotated nvidia pod was denied: %v\n%s", err, out)
	}
	override := ok + "    required-plugins.noderesource.dev/container.main: '[]'\n"
	if out, err := d.Kube().Kubectl(ctx, pod(override), "apply", "--dry-run=server", "-f", "-"); err == nil {
		t.Fatalf("a container-scoped override of the required plugins was admitted:\n%s", out)
	}
	// A GPU request without the RuntimeClass needs the annotation too: while
	// nvinject-nri is down, containerd's own CDI would start it unchecked.
	gpuNoRC := strings.Replace(strings.Replace(pod(""), "  runtimeClassName: nvidia\n", "", 1),
		`command: ["true"]`, "command: [\"true\"]\n    resources: {limits: {nvidia.com/gpu: 1}}", 1)
	if out, err := d.Kube().Kubectl(ctx, gpuNoRC, "apply", "--dry-run=server", "-f", "-"); err == nil || !strings.Contains(out, "nvinject-require-nri-plugin") {
		t.Fatalf("a GPU pod without RuntimeClass nvidia or the annotation was not denied: %v\n%s", err, out)
	}
	plain := strings.Replace(pod(""), "  runtimeClassName: nvidia\n", "", 1)
	if out, err := d.Kube().Kubectl(ctx, plain, "apply", "--dry-run=server", "-f", "-"); err != nil {
		t.Fatalf("a pod without GPU or RuntimeClass was denied: %v\n%s", err, out)
	}
}
