package nodelabels

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nvinject/nvinject/gpunode/nodelabels/typednodes"
	"github.com/nvinject/nvinject/shared/contract"
)

const nodeName = "gpu-node-1"

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// node is a Node another manager (kubectl, the kubelet) labelled.
func node() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "uid-1", Labels: map[string]string{
		"kubernetes.io/hostname": nodeName, contract.DRAModeLabel: contract.DRAModeDevicePlugin,
	}}}
}

func labelsOf(t *testing.T, c *fake.Clientset) map[string]string {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels
}

// Each apply is the whole set: a label left out goes, the other managers'
// labels stay, and the other plugin (a second Publisher, the same manager)
// takes the labels over after a node move.
func TestPublishAppliesTheWholeSet(t *testing.T) {
	c := fake.NewClientset(node())
	ctx := context.Background()
	dp := New(typednodes.New(c.CoreV1().Nodes()), nodeName, WithLogger(quiet()))
	first := map[string]string{contract.GFDLabelProduct: "NVIDIA-A100-SXM4-80GB", contract.GFDLabelCount: "8", contract.GFDLabelMIGStrategy: "mixed"}
	if err := dp.Publish(ctx, first); err != nil {
		t.Fatal(err)
	}
	got := labelsOf(t, c)
	for k, v := range first {
		if got[k] != v {
			t.Errorf("after the first apply %s = %q, want %q (labels %v)", k, got[k], v, got)
		}
	}
	dra := New(typednodes.New(c.CoreV1().Nodes()), nodeName, WithLogger(quiet()))
	if err := dra.Publish(ctx, map[string]string{contract.GFDLabelProduct: "NVIDIA-A100-SXM4-80GB", contract.GFDLabelCount: "6"}); err != nil {
		t.Fatal(err)
	}
	got = labelsOf(t, c)
	if _, ok := got[contract.GFDLabelMIGStrategy]; ok || got[contract.GFDLabelCount] != "6" {
		t.Errorf("after the second apply: %v; want mig.strategy removed and count 6", got)
	}
	if got["kubernetes.io/hostname"] != nodeName || got[contract.DRAModeLabel] != contract.DRAModeDevicePlugin {
		t.Errorf("other managers' labels changed: %v", got)
	}
	if err := dra.Withdraw(ctx); err != nil {
		t.Fatal(err)
	}
	got = labelsOf(t, c)
	if _, ok := got[contract.GFDLabelProduct]; ok || len(got) != 2 {
		t.Errorf("after the withdrawal: %v; want only the other managers' two labels", got)
	}
}

// A Node that does not exist is an error and is never created.
func TestPublishNeverCreatesANode(t *testing.T) {
	c := fake.NewClientset()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var calls atomic.Int32
	p := New(typednodes.New(c.CoreV1().Nodes()), nodeName, WithLogger(quiet()), WithBackoff(time.Millisecond, 5*time.Millisecond), WithOnApply(func(error) { calls.Add(1) }))
	err := p.Publish(ctx, map[string]string{contract.GFDLabelCount: "1"})
	if err == nil || !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "--node-name") {
		t.Fatalf("Publish = %v; want NotFound naming --node-name", err)
	}
	if calls.Load() < 2 {
		t.Errorf("%d tries in 50 ms with 1 to 5 ms backoff; want retries", calls.Load())
	}
	if _, err := c.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Node after a failed publish: %v; want none created", err)
	}
}

// A failing API server is retried with backoff until an apply succeeds;
// every try is reported.
func TestPublishRetries(t *testing.T) {
	c := fake.NewClientset(node())
	var fails atomic.Int32
	fails.Store(3)
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fails.Add(-1) >= 0 {
			return true, nil, apierrors.NewServiceUnavailable("etcd is down")
		}
		return false, nil, nil
	})
	var results []error
	p := New(typednodes.New(c.CoreV1().Nodes()), nodeName, WithLogger(quiet()), WithBackoff(time.Millisecond, 2*time.Millisecond), WithOnApply(func(err error) { results = append(results, err) }))
	if err := p.Publish(context.Background(), map[string]string{contract.GFDLabelCount: "8"}); err != nil {
		t.Fatal(err)
	}
	if len(results) != 4 || results[3] != nil || !apierrors.IsServiceUnavailable(results[0]) {
		t.Errorf("tries %v; want three failures then a success", results)
	}
	if labelsOf(t, c)[contract.GFDLabelCount] != "8" {
		t.Errorf("labels %v after the retries", labelsOf(t, c))
	}
}

// The apply is a server-side apply under the shared manager, forced, with
// the Node's UID as precondition.
func TestPublishUsesTheSharedManager(t *testing.T) {
	c := fake.NewClientset(node())
	var patch k8stesting.PatchActionImpl
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patch = a.(k8stesting.PatchActionImpl)
		return false, nil, nil
	})
	if err := New(typednodes.New(c.CoreV1().Nodes()), nodeName, WithLogger(quiet())).Publish(context.Background(), map[string]string{contract.GFDLabelCount: "8"}); err != nil {
		t.Fatal(err)
	}
	if patch.PatchType != "application/apply-patch+yaml" || patch.PatchOptions.FieldManager != contract.NodeLabelManager ||
		patch.PatchOptions.Force == nil || !*patch.PatchOptions.Force || !strings.Contains(string(patch.Patch), `"uid":"uid-1"`) {
		t.Errorf("patch %s type %s options %+v; want a forced apply by %s with the Node's UID", patch.Patch, patch.PatchType, patch.PatchOptions, contract.NodeLabelManager)
	}
}
