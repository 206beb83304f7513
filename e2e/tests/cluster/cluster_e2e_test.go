//go:build e2e

package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/doctor"
)

const (
	gpu           = corev1.ResourceName("nvidia.com/gpu")
	appNS         = "default"
	appSelector   = "app=vllm-demo"
	pluginNS      = "nvidia-device-plugin"
	configMapName = "single-gpu-device-plugin"
	nriSelector   = "app.kubernetes.io/name=nvinject-nri"
)

// completion asks vLLM's OpenAI-compatible endpoint, from inside its own
// pod, for one completion with the model it serves.
const completion = `import json, urllib.request
base = "http://127.0.0.1:8000/v1"
model = json.load(urllib.request.urlopen(base + "/models", timeout=30))["data"][0]["id"]
req = urllib.request.Request(base + "/completions", data=json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 8}).encode(), headers={"Content-Type": "application/json"})
print(json.dumps(json.load(urllib.request.urlopen(req, timeout=120))))
`

func TestCluster(t *testing.T) {
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		t.Skip("KUBECONFIG is unset: point it at a GPU cluster (e2e/tests/cluster/nvkind-up.sh sets one up) to run the cluster suite")
	}
	env, err := Connect(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	readyTimeout, err := time.ParseDuration(Getenv("NVINJECT_VLLM_READY_TIMEOUT", "20m"))
	if err != nil {
		t.Fatalf("NVINJECT_VLLM_READY_TIMEOUT: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout+10*time.Minute)
	defer cancel()

	switch mode := Getenv("NVINJECT_CLUSTER_DEPLOY", "installed"); mode {
	case "installed":
		t.Log("using the nvinject installed in the cluster (NVINJECT_CLUSTER_DEPLOY=apply deploys deploy/ first)")
	case "apply":
		deployNvinject(ctx, t, env)
	default:
		t.Fatalf("NVINJECT_CLUSTER_DEPLOY=%q: want installed or apply", mode)
	}

	var node *corev1.Node
	err = Poll(ctx, 3*time.Second, func(ctx context.Context) error {
		n, err := env.GPUNode(ctx, os.Getenv("NVINJECT_WORKER"), string(gpu))
		if err != nil {
			return err
		}
		c, a := n.Status.Capacity[gpu], n.Status.Allocatable[gpu]
		if c.Value() != 1 || a.Value() != 1 {
			return fmt.Errorf("Node %s %s capacity %s allocatable %s, want 1 and 1", n.Name, gpu, c.String(), a.String())
		}
		node = n
		return nil
	})
	if err != nil {
		t.Fatalf("worker's GPU resource (the doctor's registration/health layers say why): %v", err)
	}
	t.Logf("Node %s publishes %s capacity=1 allocatable=1", node.Name, gpu)

	pod := waitVLLMReady(ctx, t, env, readyTimeout)
	checkPodSpec(t, pod)

	cm, err := env.Client.CoreV1().ConfigMaps(pluginNS).Get(ctx, configMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	selected := strings.TrimSpace(cm.Data["selected-gpu-uuid"])
	smi, err := env.Exec(ctx, pod.Namespace, pod.Name, "vllm", "nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader")
	if err != nil {
		t.Fatal(err)
	}
	inPod := UUIDs(smi)
	if len(inPod) != 1 || inPod[0] != selected {
		t.Errorf("nvidia-smi in %s reports %v, want exactly the ConfigMap's selected %s", pod.Name, inPod, selected)
	}
	if recorded := nriRecorded(ctx, t, env, pod); !slices.Contains(recorded, selected) || slices.ContainsFunc(recorded, func(u string) bool { return u != selected }) {
		t.Errorf("nvinject-nri recorded %v for %s, want %s", recorded, pod.Name, selected)
	}
	t.Logf("pod %s sees %s = ConfigMap selected-gpu-uuid = nvinject-nri's record", pod.Name, selected)

	out, err := env.Exec(ctx, pod.Namespace, pod.Name, "vllm", "python3", "-c", completion)
	if err != nil {
		t.Fatalf("completion request: %v", err)
	}
	var resp struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Choices) == 0 || strings.TrimSpace(resp.Choices[0].Text) == "" {
		t.Fatalf("completion answer %q: %v", out, err)
	}
	t.Logf("vLLM completed %q", resp.Choices[0].Text)

	runDoctor(ctx, t, env, node.Name)
	secondPodPending(ctx, t, env)
}

func deployNvinject(ctx context.Context, t *testing.T, env *Env) {
	t.Helper()
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	overlay := Getenv("NVINJECT_DEPLOY_OVERLAY", filepath.Join(root, "deploy/overlays/nvkind-worker"))
	for _, dir := range []string{overlay, filepath.Join(root, "deploy/examples/vllm")} {
		out, err := env.Kubectl(ctx, "apply", "-k", dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kubectl apply -k %s:\n%s", dir, out)
	}
}

func waitVLLMReady(ctx context.Context, t *testing.T, env *Env, timeout time.Duration) *corev1.Pod {
	t.Helper()
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var pod *corev1.Pod
	err := Poll(wctx, 10*time.Second, func(ctx context.Context) error {
		d, err := env.Client.AppsV1().Deployments(appNS).Get(ctx, "vllm-demo", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !deploymentReady(d) {
			return fmt.Errorf("Deployment vllm-demo: %d/%d ready", d.Status.ReadyReplicas, *d.Spec.Replicas)
		}
		pods, err := env.Client.CoreV1().Pods(appNS).List(ctx, metav1.ListOptions{LabelSelector: appSelector})
		if err != nil {
			return err
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("no running pod %s", appSelector)
	})
	if err != nil {
		t.Fatalf("vLLM did not become Ready in %s (run nvinject-doctor --node <worker> for the failing layer): %v", timeout, err)
	}
	t.Logf("Deployment vllm-demo Ready after %s (pod %s)", time.Since(start).Round(time.Second), pod.Name)
	return pod
}

func deploymentReady(d *appsv1.Deployment) bool {
	return d.Spec.Replicas != nil && d.Status.ReadyReplicas == *d.Spec.Replicas && d.Status.UpdatedReplicas == *d.Spec.Replicas
}

// checkPodSpec: runtimeClassName nvidia and a GPU limit whose request the
// API server defaulted from the limit (the Deployment gives only the limit).
func checkPodSpec(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if rc := pod.Spec.RuntimeClassName; rc == nil || *rc != "nvidia" {
		t.Errorf("pod %s runtimeClassName = %v, want nvidia", pod.Name, rc)
	}
	c := pod.Spec.Containers[0]
	lim, req := c.Resources.Limits[gpu], c.Resources.Requests[gpu]
	if lim.Value() != 1 || req.Value() != 1 {
		t.Errorf("pod %s %s limit %s request %s, want 1 and 1", pod.Name, gpu, lim.String(), req.String())
	}
	t.Logf("pod %s on %s: runtimeClassName=nvidia, %s limit=%s request=%s", pod.Name, pod.Spec.NodeName, gpu, lim.String(), req.String())
}

// nriRecorded reads the UUIDs nvinject-nri logged for pod on its node.
func nriRecorded(ctx context.Context, t *testing.T, env *Env, pod *corev1.Pod) []string {
	t.Helper()
	pods, err := env.Client.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: nriSelector})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != pod.Spec.NodeName {
			continue
		}
		rc, err := env.Client.CoreV1().Pods(pluginNS).GetLogs(p.Name, &corev1.PodLogOptions{}).Stream(ctx)
		if err != nil {
			t.Fatalf("nvinject-nri log: %v", err)
		}
		var b bytes.Buffer
		_, err = io.Copy(&b, rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		return InjectedUUIDs(b.String(), pod.Namespace+"/"+pod.Name)
	}
	t.Fatalf("no nvinject-nri pod (%s) on %s", nriSelector, pod.Spec.NodeName)
	return nil
}

// runDoctor: with the chain working, no layer the doctor can see from
// here is broken. The suite runs on the GPU host, not in the worker, so
// the doctor reads the API only (Remote).
func runDoctor(ctx context.Context, t *testing.T, env *Env, node string) {
	t.Helper()
	r, err := doctor.Run(ctx, doctor.Options{Client: env.Client, Node: node, PodNamespace: appNS, Remote: true})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := doctor.WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	t.Logf("nvinject-doctor:\n%s", b.String())
	if broken := r.Broken(); len(broken) > 0 {
		t.Errorf("doctor reports broken layers %v on a working cluster", broken)
	}
}

// secondPodPending: the only GPU is held by vLLM, so another GPU pod stays
// Pending with Insufficient nvidia.com/gpu.
func secondPodPending(ctx context.Context, t *testing.T, env *Env) {
	t.Helper()
	rc := "nvidia"
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "nvinject-e2e-second-gpu-", Namespace: appNS},
		Spec: corev1.PodSpec{RuntimeClassName: &rc, Containers: []corev1.Container{{
			Name: "c", Image: "registry.k8s.io/pause:3.10.1",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpu: resource.MustParse("1")}},
		}}},
	}
	p, err := env.Client.CoreV1().Pods(appNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.CoreV1().Pods(appNS).Delete(context.Background(), p.Name, metav1.DeleteOptions{})
	})
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = Poll(wctx, 2*time.Second, func(ctx context.Context) error {
		got, err := env.Client.CoreV1().Pods(appNS).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Spec.NodeName != "" {
			return fmt.Errorf("second GPU pod was bound to %s", got.Spec.NodeName)
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "Insufficient nvidia.com/gpu") {
				t.Logf("second GPU pod %s Pending: %s", p.Name, c.Message)
				return nil
			}
		}
		return fmt.Errorf("second GPU pod %s: phase %s, no Insufficient nvidia.com/gpu yet", p.Name, got.Status.Phase)
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := doctor.Run(ctx, doctor.Options{Client: env.Client, PodNamespace: appNS, Remote: true})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := r.Verdict(doctor.LayerScheduling); v.Status != doctor.Broken || !strings.Contains(strings.Join(v.Evidence, "\n"), p.Name) {
		t.Errorf("doctor scheduling verdict = %s %v, want broken naming %s", v.Status, v.Evidence, p.Name)
	}
}
