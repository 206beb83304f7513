package move

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nvinject/nvinject/shared/contract"
)

const node = "gpu-1"

// cluster is a fake API server with the part of the control plane a move relies on:
// the DaemonSets' pods follow the node's mode label (the DaemonSet controller), and
// an eviction deletes the pod unless a budget refuses it refusals times.
type cluster struct {
	c        *fake.Clientset
	refusals int
	evicted  []string
}

func newCluster(t *testing.T, mode string, objs ...runtime.Object) *cluster {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{contract.DRAModeLabel: mode}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{}}}
	k := &cluster{c: fake.NewClientset(append([]runtime.Object{n}, objs...)...)}
	k.follow(t, mode)
	k.c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		if k.refusals > 0 {
			k.refusals--
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		name := a.(k8stesting.CreateAction).GetObject().(metav1.Object).GetName()
		k.evicted = append(k.evicted, name)
		return true, nil, k.c.Tracker().Delete(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, a.GetNamespace(), name)
	})
	k.c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), contract.DRAModeLabel) {
			mode := contract.DRAModeDRA
			if strings.Contains(string(a.(k8stesting.PatchAction).GetPatch()), contract.DRAModeDevicePlugin) {
				mode = contract.DRAModeDevicePlugin
			}
			defer k.follow(t, mode)
		}
		return false, nil, nil
	})
	return k
}

// follow makes the owner of mode run Ready on the node and publish, and the other go.
func (k *cluster) follow(t *testing.T, mode string) {
	pods := k.c.Tracker()
	podsGVR := schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	slicesGVR := schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceslices"}
	_ = pods.Delete(podsGVR, contract.Namespace, contract.DevicePluginApp)
	_ = pods.Delete(podsGVR, contract.Namespace, contract.DRAApp)
	_ = pods.Delete(slicesGVR, "", "slice")
	app := contract.DevicePluginApp
	// The tracker, not the clientset: follow runs inside a reactor, which holds the
	// fake clientset's lock.
	obj, err := pods.Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", node)
	if err != nil {
		t.Fatal(err)
	}
	n := obj.(*corev1.Node)
	n.Status.Allocatable = corev1.ResourceList{}
	if mode == contract.DRAModeDRA {
		app = contract.DRAApp
		s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "slice"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: contract.DRADriver, NodeName: new(node), Devices: []resourceapi.Device{{Name: "gpu-0"}}}}
		if err := pods.Add(s); err != nil {
			t.Fatal(err)
		}
	} else {
		n.Status.Allocatable[contract.ResourceName] = resource.MustParse("8")
	}
	if err := pods.Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, n, ""); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: contract.Namespace, Labels: map[string]string{contract.AppLabel: app},
		OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: app}}},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
}

func gpuPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{NodeName: node,
		Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{contract.ResourceName: resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newMover(k *cluster, opts ...Option) *Mover {
	return New(k.c, append([]Option{WithPollInterval(time.Millisecond), WithTimeout(2 * time.Second), WithLogger(quiet())}, opts...)...)
}

func getNode(t *testing.T, k *cluster) *corev1.Node {
	t.Helper()
	n, err := k.c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMoveToDRAEvictsThroughTheBudgetAndIsIdempotent(t *testing.T) {
	k := newCluster(t, contract.DRAModeDevicePlugin, gpuPod("vllm-0"), gpuPod("vllm-1"))
	k.refusals = 2
	m := newMover(k)
	r, err := m.Move(context.Background(), node, contract.DRAModeDRA)
	if err != nil {
		t.Fatalf("move: %v (%+v)", err, r)
	}
	var steps []string
	for _, s := range r.Steps {
		steps = append(steps, s.Name)
	}
	if strings.Join(steps, ",") != "cordon,evict,move,wait,uncordon" || r.From != contract.DRAModeDevicePlugin {
		t.Errorf("steps %v from %s; want cordon,evict,move,wait,uncordon from device-plugin", steps, r.From)
	}
	if len(k.evicted) != 2 || k.refusals != 0 {
		t.Errorf("evicted %v with %d refusals left; want both pods, after the budget's two refusals", k.evicted, k.refusals)
	}
	n := getNode(t, k)
	if Mode(n) != contract.DRAModeDRA || n.Spec.Unschedulable || n.Annotations[CordonedBy] != "" || n.Annotations[Failed] != "" {
		t.Errorf("node after the move: mode %s unschedulable %t annotations %v", Mode(n), n.Spec.Unschedulable, n.Annotations)
	}
	again, err := m.Move(context.Background(), node, contract.DRAModeDRA)
	if err != nil || !again.NoOp || len(again.Steps) != 0 {
		t.Errorf("second move: %+v, %v; want a no-op", again, err)
	}
}

func TestMoveBackRefusesWhileClaimsArePrepared(t *testing.T) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "default"}, Status: resourceapi.ResourceClaimStatus{
		Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{Driver: contract.DRADriver, Pool: node, Device: "gpu-0"}}}},
		ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "u"}}}}
	k := newCluster(t, contract.DRAModeDRA, claim)
	_, err := newMover(k).Move(context.Background(), node, contract.DRAModeDevicePlugin)
	if err == nil || !strings.Contains(err.Error(), "default/c1") || !strings.Contains(err.Error(), "--drain-claims") {
		t.Fatalf("move back with a prepared claim: %v; want a refusal naming the claim and --drain-claims", err)
	}
	n := getNode(t, k)
	if Mode(n) != contract.DRAModeDRA || !n.Spec.Unschedulable || !strings.Contains(n.Annotations[Failed], "default/c1") {
		t.Errorf("refused node: mode %s unschedulable %t annotations %v; want it on DRA, cordoned, with the reason", Mode(n), n.Spec.Unschedulable, n.Annotations)
	}
}

func TestCordonedBeforeStaysCordoned(t *testing.T) {
	k := newCluster(t, contract.DRAModeDevicePlugin)
	n := getNode(t, k)
	n.Spec.Unschedulable = true
	if _, err := k.c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := newMover(k).Move(context.Background(), node, contract.DRAModeDRA); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, k); !n.Spec.Unschedulable || Mode(n) != contract.DRAModeDRA {
		t.Errorf("a node an operator cordoned: unschedulable %t mode %s after the move; want moved and still cordoned", n.Spec.Unschedulable, Mode(n))
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	k := newCluster(t, contract.DRAModeDevicePlugin, gpuPod("vllm-0"))
	r, err := newMover(k, WithDryRun()).Move(context.Background(), node, contract.DRAModeDRA)
	if err != nil || len(r.Steps) != 1 || !strings.Contains(r.Steps[0].Detail, "default/vllm-0") {
		t.Fatalf("dry run: %+v, %v; want one plan step naming the pod", r, err)
	}
	if n := getNode(t, k); Mode(n) != contract.DRAModeDevicePlugin || n.Spec.Unschedulable || len(k.evicted) != 0 {
		t.Errorf("dry run changed the node (mode %s, unschedulable %t) or evicted %v", Mode(n), n.Spec.Unschedulable, k.evicted)
	}
}

func TestBudgetThatNeverAllowsFailsAndLeavesTheNodeCordoned(t *testing.T) {
	k := newCluster(t, contract.DRAModeDevicePlugin, gpuPod("vllm-0"))
	k.refusals = 1 << 30
	_, err := newMover(k, WithTimeout(50*time.Millisecond)).Move(context.Background(), node, contract.DRAModeDRA)
	if err == nil || !strings.Contains(err.Error(), "PodDisruptionBudget") {
		t.Fatalf("move against a budget that never allows: %v; want a timeout naming the budget", err)
	}
	if n := getNode(t, k); !n.Spec.Unschedulable || Mode(n) != contract.DRAModeDevicePlugin || n.Annotations[Failed] == "" {
		t.Errorf("node: unschedulable %t mode %s annotations %v; want cordoned, not moved, with the reason", n.Spec.Unschedulable, Mode(n), n.Annotations)
	}
}

func TestUpgradeWaitsForTheNewDriver(t *testing.T) {
	k := newCluster(t, contract.DRAModeDevicePlugin, gpuPod("vllm-0"))
	ran := ""
	run := func(ctx context.Context, command, n string) (string, error) {
		ran = command + " " + n
		node, err := k.c.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		node.Labels[contract.GFDLabelDriverVersion] = "550.163.01"
		_, err = k.c.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return "switched\n", err
	}
	m := newMover(k, WithCommandRunner(run))
	r, err := m.Upgrade(context.Background(), node, "550.163.01", "switch-driver")
	if err != nil || ran != "switch-driver "+node || len(k.evicted) != 1 {
		t.Fatalf("upgrade: %+v, %v; ran %q, evicted %v", r, err, ran, k.evicted)
	}
	if again, err := m.Upgrade(context.Background(), node, "550.163.01", "switch-driver"); err != nil || !again.NoOp {
		t.Errorf("second upgrade: %+v, %v; want a no-op", again, err)
	}
}

func TestRollStopsAtTheFirstFailure(t *testing.T) {
	var done []string
	reports, err := Roll(context.Background(), []string{"a", "b", "c", "d"}, 1, func(_ context.Context, n string) (Report, error) {
		done = append(done, n)
		if n == "b" {
			return Report{Node: n, Error: "no"}, apierrors.NewBadRequest("no")
		}
		return Report{Node: n}, nil
	})
	if err == nil || strings.Join(done, "") != "ab" || len(reports) != 2 || !strings.Contains(err.Error(), "1 of 4") {
		t.Errorf("roll: done %v, %d reports, %v; want a and b tried, c and d untouched, 1 of 4 done", done, len(reports), err)
	}
}
