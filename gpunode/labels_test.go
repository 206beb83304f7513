package gpunode

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nvinject/nvinject/gpunode/nodelabels"
	"github.com/nvinject/nvinject/gpunode/nodelabels/typednodes"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// testNode is the Node the tests' nodes label.
const testNode = "gpu-node-1"

const appliesMetric = "test_label_applies_total"

func labelledCluster() *fake.Clientset {
	return fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{"kubernetes.io/hostname": testNode}}})
}

// waitLabels waits until the Node's labels satisfy ok.
func waitLabels(t *testing.T, c *fake.Clientset, what string, ok func(map[string]string) bool) map[string]string {
	t.Helper()
	var got map[string]string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n, err := c.CoreV1().Nodes().Get(context.Background(), testNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got = n.Labels; ok(got) {
			return got
		}
	}
	t.Fatalf("the Node's labels never %s: %v", what, got)
	return nil
}

func applies(n *Node, result string) float64 {
	mfs, _ := n.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != appliesMetric {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// Each round applies its own labels: a MIG layout change republishes them,
// the destroyed profile's labels go and the new one's come.
func TestLabelsFollowTheLayout(t *testing.T) {
	c := labelledCluster()
	var simNode *sim.Node
	open := func(v string, o backend.Options) (*backend.Backend, error) {
		b, node, err := backend.OpenSimulated(v, o)
		simNode = node
		return b, err
	}
	cfg := config(t, "--nvml="+migSpec, "--driver-root="+roots.Get(t, migSpec), "--mig-rescan-interval=10ms", "--mig-strategy=mixed")
	n := New(cfg, quietLog(), WithOpen(open), WithNodeLabels(typednodes.New(c.CoreV1().Nodes()), appliesMetric))
	rounds := make(chan GPUs, 8)
	run(t, n, func(ctx context.Context, g GPUs) error {
		rounds <- g
		<-ctx.Done()
		return nil
	})
	first := <-rounds
	got := waitLabels(t, c, "described the first layout", func(l map[string]string) bool { return l["nvidia.com/mig-1g.10gb.count"] == "1" })
	if got[contract.GFDLabelProduct] != "NVIDIA-A100-SXM4-80GB" || got[contract.GFDLabelCount] != "2" || got[contract.GFDLabelMIGStrategy] != "mixed" ||
		got["nvidia.com/mig-3g.40gb.count"] != "1" || got["kubernetes.io/hostname"] != testNode {
		t.Errorf("first round's labels %v", got)
	}
	gi := -1
	for _, m := range first.Published[1].MIG {
		if m.Profile == "1g.10gb" {
			gi = m.GPUInstance
		}
	}
	if err := simNode.DestroyGPUInstance(1, gi); err != nil {
		t.Fatal(err)
	}
	if _, _, err := simNode.CreateGPUInstance(1, "2g.20gb"); err != nil {
		t.Fatal(err)
	}
	got = waitLabels(t, c, "described the new layout", func(l map[string]string) bool { return l["nvidia.com/mig-2g.20gb.count"] == "1" })
	for k := range got {
		if strings.HasPrefix(k, "nvidia.com/mig-1g.10gb.") {
			t.Errorf("label %s of the destroyed profile left after the republish", k)
		}
	}
	// The fake API server shows the patch before the publisher counts it.
	for deadline := time.Now().Add(10 * time.Second); applies(n, "ok") < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v successful applies; want one per round", applies(n, "ok"))
		}
	}
}

// A failing API server holds up neither the round nor readiness; the
// failures are counted and retried.
func TestLabelsFailureLeavesTheNodeServing(t *testing.T) {
	c := labelledCluster()
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("the API server is down")
	})
	n := New(config(t), quietLog(), WithNodeLabels(typednodes.New(c.CoreV1().Nodes()), appliesMetric, nodelabels.WithBackoff(time.Millisecond, 5*time.Millisecond)))
	served := make(chan struct{})
	run(t, n, func(ctx context.Context, g GPUs) error {
		close(served)
		<-ctx.Done()
		return nil
	})
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the protocol never started while the labels failed")
	}
	for deadline := time.Now().Add(10 * time.Second); applies(n, "error") < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%v failed applies; want them retried", applies(n, "error"))
		}
	}
	if err := n.Ready(); err != nil {
		t.Errorf("Ready while the labels fail: %v; want ready (the GPUs are served)", err)
	}
}

// A node that publishes no GPU removes the GPU labels an earlier run
// published, as it fails.
func TestNoGPUWithdrawsTheLabels(t *testing.T) {
	c := labelledCluster()
	if err := nodelabels.New(typednodes.New(c.CoreV1().Nodes()), testNode, nodelabels.WithLogger(quietLog())).Publish(context.Background(), map[string]string{contract.GFDLabelCount: "8"}); err != nil {
		t.Fatal(err)
	}
	n := New(config(t, "--visible-devices=none"), quietLog(), WithNodeLabels(typednodes.New(c.CoreV1().Nodes()), appliesMetric))
	if err := <-run(t, n, func(context.Context, GPUs) error { return nil }); err == nil || !strings.Contains(err.Error(), "no GPU to publish") {
		t.Fatalf("Run = %v; want no GPU to publish", err)
	}
	got := waitLabels(t, c, "lost the GPU labels", func(l map[string]string) bool { _, ok := l[contract.GFDLabelCount]; return !ok })
	if got["kubernetes.io/hostname"] != testNode {
		t.Errorf("labels %v; the kubelet's hostname label must stay", got)
	}
}
