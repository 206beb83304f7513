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
	repo, err := filepath.Abs("../../..")
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

// The admission policies are the first half of failing closed: an nvidia
// or GPU pod reaches containerd only with the required-plugins annotation
// naming nvinject. The mutating policy adds it to pods that name no
// required plugins; the validating one refuses, with its reason, pods whose
// own annotations drop nvinject or override it per container.
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
	const want = `required-plugins.noderesource.dev/pod: '["nvinject"]'`
	admitted := func(what, manifest string, annotated bool) {
		t.Helper()
		out, err := d.Kube().Kubectl(ctx, manifest, "apply", "--dry-run=server", "-o", "yaml", "-f", "-")
		if err != nil {
			t.Fatalf("%s was denied: %v\n%s", what, err, out)
		}
		if strings.Contains(out, want) != annotated {
			t.Errorf("%s admitted; carries %s: %v, want %v:\n%s", what, want, !annotated, annotated, out)
		}
	}
	denied := func(what, manifest string) {
		t.Helper()
		out, err := d.Kube().Kubectl(ctx, manifest, "apply", "--dry-run=server", "-f", "-")
		if err == nil || !strings.Contains(out, "nvinject-require-nri-plugin") || !strings.Contains(out, "container-scoped override") {
			t.Errorf("%s was not denied by the validating policy with its reason: %v\n%s", what, err, out)
		}
	}
	admitted("an nvidia pod without annotations", pod(""), true)
	other := "  annotations:\n    team: ml\n"
	out, err := d.Kube().Kubectl(ctx, pod(other), "apply", "--dry-run=server", "-o", "yaml", "-f", "-")
	if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "team: ml") {
		t.Errorf("an nvidia pod with another annotation: want both annotations, got %v\n%s", err, out)
	}
	ok := "  annotations:\n    " + want + "\n"
	admitted("an annotated nvidia pod", pod(ok), true)
	denied("a pod annotation dropping nvinject", pod("  annotations:\n    required-plugins.noderesource.dev/pod: '[\"other\"]'\n"))
	denied("a container-scoped override", pod("  annotations:\n    required-plugins.noderesource.dev/container.main: '[]'\n"))
	denied("a container-scoped override beside the pod annotation", pod(ok+"    required-plugins.noderesource.dev/container.main: '[]'\n"))
	// A GPU request without the RuntimeClass gets the annotation too: while
	// nvinject-nri is down, containerd's own CDI would start it unchecked.
	gpuNoRC := strings.Replace(strings.Replace(pod(""), "  runtimeClassName: nvidia\n", "", 1),
		`command: ["true"]`, "command: [\"true\"]\n    resources: {limits: {nvidia.com/gpu: 1}}", 1)
	admitted("a GPU pod without RuntimeClass nvidia", gpuNoRC, true)
	admitted("a pod without GPU or RuntimeClass", strings.Replace(pod(""), "  runtimeClassName: nvidia\n", "", 1), false)
}
