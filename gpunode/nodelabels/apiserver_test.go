package nodelabels

import (
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/kubeclient"
	"github.com/nvinject/nvinject/shared/kubehttp"
)

// TestPublishOnARealAPIServer runs the publisher against the API server
// NVINJECT_TEST_KUBECONFIG names (a kube-apiserver and etcd of the pinned
// tools on ports of one's own; nodes create, get, patch, delete): the
// server's own server-side apply removes what an apply leaves out, keeps
// other managers' labels, and the UID precondition refuses to create a
// Node. The fake clientset's tracker stands for it in the other tests.
func TestPublishOnARealAPIServer(t *testing.T) {
	kubeconfig := os.Getenv("NVINJECT_TEST_KUBECONFIG")
	if kubeconfig == "" {
		t.Skip("NVINJECT_TEST_KUBECONFIG is not set: no API server to publish on")
	}
	cfg, err := kubeclient.Config(kubeconfig, "nodelabels-test")
	if err != nil {
		t.Fatal(err)
	}
	c := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	const name = "nodelabels-test-node"
	_ = c.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })

	nodes, err := Client(kubeconfig, kubehttp.InCluster{}, "nodelabels-test")
	if err != nil {
		t.Fatal(err)
	}
	p := New(nodes, name, WithLogger(quiet()))
	if err := p.Publish(ctx, map[string]string{contract.GFDLabelProduct: "NVIDIA-A100-SXM4-80GB", contract.GFDLabelMIGStrategy: "mixed"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(ctx, map[string]string{contract.GFDLabelProduct: "NVIDIA-H100-80GB-HBM3"}); err != nil {
		t.Fatal(err)
	}
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := n.Labels[contract.GFDLabelMIGStrategy]; ok || n.Labels[contract.GFDLabelProduct] != "NVIDIA-H100-80GB-HBM3" || n.Labels["kubernetes.io/hostname"] != name {
		t.Errorf("labels after two applies: %v; want mig.strategy removed, the H100 product, the hostname kept", n.Labels)
	}
	managers := map[string]bool{}
	for _, f := range n.ManagedFields {
		managers[f.Manager] = true
	}
	if !managers[contract.NodeLabelManager] {
		t.Errorf("managed fields %+v; want a %s entry", n.ManagedFields, contract.NodeLabelManager)
	}
	if err := p.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err = c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil || n.Labels[contract.GFDLabelProduct] != "" || n.Labels["kubernetes.io/hostname"] != name {
		t.Errorf("labels after the withdrawal: %v, %v", n.Labels, err)
	}

	// A Node deleted and created again under the same name between the read
	// and the apply has another UID: the precondition refuses. A Node that
	// is gone is not created.
	if err := nodes.ApplyLabels(ctx, name, "not-its-uid", map[string]string{contract.GFDLabelCount: "1"}); err == nil {
		t.Error("an apply with another Node's UID succeeded; want the precondition to refuse it")
	}
	gone := New(nodes, "nodelabels-no-such-node", WithLogger(quiet()))
	if err := gone.Withdraw(ctx); !apierrors.IsNotFound(err) {
		t.Errorf("apply to a missing Node: %v; want NotFound", err)
	}
	if _, err := c.CoreV1().Nodes().Get(ctx, "nodelabels-no-such-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the missing Node after an apply: %v; want still missing", err)
	}
}
