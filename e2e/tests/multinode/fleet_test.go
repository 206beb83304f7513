package multinode

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/harness/driverroot"
	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

const ns = "default"

// products are the GPU feature discovery product labels of the simulated models.
var products = map[string]string{
	"a100-80gb": "NVIDIA-A100-SXM4-80GB",
	"h100-80gb": "NVIDIA-H100-80GB-HBM3",
}

func model(n rig.FleetNode) string {
	m, _, _ := strings.Cut(strings.TrimPrefix(n.NVML, "sim:"), "*")
	m, _, _ = strings.Cut(m, ",")
	return m
}

// uuidsOf are the GPU UUIDs of a node's simulated GPUs.
func uuidsOf(t testing.TB, n rig.FleetNode) []string {
	t.Helper()
	g, err := rig.SimulatedGPUs(context.Background(), n.NVML)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range g.Devices {
		out = append(out, d.UUID)
	}
	return out
}

func TestEveryNodePublishesItsGPUsAndLabels(t *testing.T) {
	d := need(t)
	ctx := context.Background()
	seen := map[string]string{}
	for _, n := range nodes {
		if err := d.FleetNodePublished(ctx, n); err != nil {
			t.Errorf("node %s: %v", n.Name, err)
		}
		for _, u := range uuidsOf(t, n) {
			if other, dup := seen[u]; dup {
				t.Errorf("GPU %s is on %s and %s: every node's GPUs must be its own", u, other, n.Name)
			}
			seen[u] = n.Name
		}
		node, err := d.Kube().Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			contract.GFDLabelProduct: products[model(n)],
			contract.GFDLabelCount:   "8",
			contract.GFDLabelMemory:  "81920",
		}
		if drv := d.DriverOf(n); drv.Real() {
			want[contract.GFDLabelDriverVersion] = cmp.Or(drv.Version, driverroot.DriverVersion)
		}
		for k, v := range want {
			if got := node.Labels[k]; got != v {
				t.Errorf("node %s (%s): label %s=%q, want %q", n.Name, n.Mode, k, got, v)
			}
		}
		if n.Mode != contract.DRAModeDRA {
			continue
		}
		devs, err := d.NodeSliceDevices(ctx, n.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, dev := range devs {
			if a := dev.Attributes[contract.DRAAttrProductName]; a.StringValue == nil || !strings.Contains(*a.StringValue, "H100") {
				t.Errorf("node %s device %s: productName %v, want the H100's", n.Name, dev.Name, a.StringValue)
			}
		}
	}
}

// TestProductSelectorLandsOnThatModel is the vLLM Deployment of a fleet: one per model,
// selecting the model by GPU feature discovery's product label, on both paths.
func TestProductSelectorLandsOnThatModel(t *testing.T) {
	need(t)
	ctx := context.Background()
	for m, product := range products {
		var on []rig.FleetNode
		for _, n := range nodes {
			if model(n) == m {
				on = append(on, n)
			}
		}
		name := "by-" + strings.ReplaceAll(m, ".", "")
		pods := runDeployment(t, ctx, name, 2*len(on), map[string]string{contract.GFDLabelProduct: product})
		owned := map[string]string{}
		for _, n := range on {
			for _, u := range uuidsOf(t, n) {
				owned[u] = n.Name
			}
		}
		got := map[string]bool{}
		for _, p := range pods {
			u := podUUID(t, ctx, p)
			if owned[u] != p.Spec.NodeName {
				t.Errorf("pod %s on %s (selecting %s) has GPU %s, which is %q's; want one of its own node's %s GPUs", p.Name, p.Spec.NodeName, product, u, owned[u], m)
			}
			if got[u] {
				t.Errorf("GPU %s given to two pods", u)
			}
			got[u] = true
		}
		t.Logf("FIGURE fleet: %d pods selecting %s ran on %v, each with its own GPU of that model", len(pods), product, nodesOf(pods))
	}
}

// runDeployment runs a Deployment of one-GPU sleepers on the nodes selector picks,
// deleted when t ends, and returns its pods once all are Running.
func runDeployment(t testing.TB, ctx context.Context, name string, replicas int, selector map[string]string) []corev1.Pod {
	t.Helper()
	return runDeploymentOf(t, ctx, name, rig.BusyboxImage, replicas, selector)
}

// runDeploymentOf is runDeployment with the pods' image.
func runDeploymentOf(t testing.TB, ctx context.Context, name, image string, replicas int, selector map[string]string) []corev1.Pod {
	t.Helper()
	d := need(t)
	rc := contract.RuntimeHandler
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{
					rig.RequiredPluginsAnnotation: `["` + contract.NRIPluginName + `"]`}},
				Spec: corev1.PodSpec{
					RuntimeClassName: &rc, NodeSelector: selector, TerminationGracePeriodSeconds: new(int64),
					Containers: []corev1.Container{{
						Name: "main", Image: image, ImagePullPolicy: corev1.PullNever,
						Command:   []string{"/bin/sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"},
						Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{rig.Resource: resource.MustParse("1")}},
					}},
				},
			},
		},
	}
	deps := d.Kube().Client.AppsV1().Deployments(ns)
	if _, err := deps.Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Deployment %s: %v", name, err)
	}
	t.Cleanup(func() { deleteDeployment(t, name) })
	return waitRunning(t, ctx, "app="+name, replicas)
}

func deleteDeployment(t testing.TB, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := need(t)
	if err := d.Kube().Client.AppsV1().Deployments(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete Deployment %s: %v", name, err)
	}
	if err := d.WaitPodsGone(ctx, ns, "app="+name); err != nil {
		t.Errorf("Deployment %s: %v", name, err)
	}
}

// waitRunning waits until selector matches n Running, Ready pods.
func waitRunning(t testing.TB, ctx context.Context, selector string, n int) []corev1.Pod {
	t.Helper()
	d := need(t)
	var pods []corev1.Pod
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	err := rig.Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		list, err := d.Kube().Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		pods = pods[:0]
		var states []string
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && ready(p) {
				pods = append(pods, p)
			}
			states = append(states, p.Name+"@"+p.Spec.NodeName+":"+string(p.Status.Phase))
		}
		if len(pods) != n {
			return fmt.Errorf("%d of %d pods Running and Ready: %v", len(pods), n, states)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pods %s: %v", selector, err)
	}
	return slices.Clone(pods)
}

func ready(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podUUID is the GPU nvinject-nri checked into the pod, read inside it.
func podUUID(t testing.TB, ctx context.Context, p corev1.Pod) string {
	t.Helper()
	out, err := need(t).Kube().Exec(ctx, p.Namespace, p.Name, "main", "env")
	if err != nil {
		t.Fatalf("env in pod %s on %s: %v", p.Name, p.Spec.NodeName, err)
	}
	var uuids []string
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && strings.HasPrefix(k, "NVINJECT_GPU_UUID_") {
			uuids = append(uuids, v)
		}
	}
	if len(uuids) != 1 {
		t.Fatalf("pod %s on %s sees GPUs %v; want exactly one", p.Name, p.Spec.NodeName, uuids)
	}
	return uuids[0]
}

func nodesOf(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		if !slices.Contains(out, p.Spec.NodeName) {
			out = append(out, p.Spec.NodeName)
		}
	}
	slices.Sort(out)
	return out
}
