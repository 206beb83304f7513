package multinode

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
)

// TestXidOnOneNodeSendsNewPodsToTheOthers: every GPU of the first node gets a
// critical Xid; new GPU pods land on the other nodes; after recovery it publishes
// all its GPUs again.
func TestXidOnOneNodeSendsNewPodsToTheOthers(t *testing.T) {
	d := need(t)
	ctx := context.Background()
	sick := nodes[0]
	t.Cleanup(func() {
		for _, u := range uuidsOf(t, sick) {
			if err := d.FleetSimDebug(ctx, sick, "recover", "uuid="+u); err != nil {
				t.Errorf("recover %s on %s: %v", u, sick.Name, err)
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := rig.Poll(wctx, 500*time.Millisecond, func(ctx context.Context) error { return d.FleetNodePublished(ctx, sick) }); err != nil {
			t.Errorf("node %s after recovery: %v", sick.Name, err)
		}
	})
	t0 := time.Now()
	for _, u := range uuidsOf(t, sick) {
		if err := d.FleetSimDebug(ctx, sick, "xid", "uuid="+u+"&xid=79"); err != nil {
			t.Fatalf("Xid on %s of %s: %v", u, sick.Name, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := rig.Poll(wctx, 300*time.Millisecond, func(ctx context.Context) error {
		n, err := d.Kube().Client.CoreV1().Nodes().Get(ctx, sick.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if a := n.Status.Allocatable[corev1.ResourceName(rig.Resource)]; a.Value() != 0 {
			return fmt.Errorf("allocatable %d, want 0", a.Value())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("node %s after 8 Xids: %v", sick.Name, err)
	}
	t.Logf("FIGURE fleet: 8 Xids on %s to allocatable 0 in %s", sick.Name, time.Since(t0).Round(time.Millisecond))
	pods := runDeployment(t, ctx, "after-xid", 2, nil)
	for _, p := range pods {
		if p.Spec.NodeName == sick.Name {
			t.Errorf("pod %s landed on %s, whose GPUs all had an Xid", p.Name, sick.Name)
		}
	}
	t.Logf("FIGURE fleet: new GPU pods ran on %v while %s had none healthy", nodesOf(pods), sick.Name)
}

// TestKubeletDownForAMinute: a worker's kubelet stops for a minute; its pods run on,
// and it comes back with its GPUs published and its pods' GPUs unchanged. The other
// nodes' pods are never touched.
func TestKubeletDownForAMinute(t *testing.T) {
	d := need(t)
	ctx := context.Background()
	w := d.Node().Workers()[0]
	pods := runDeployment(t, ctx, "kubelet-down", len(nodes), map[string]string{})
	before := map[string]string{}
	for _, p := range pods {
		before[p.Name] = podUUID(t, ctx, p) + "/" + containerID(p)
	}
	if err := w.Stop(ctx, "kubelet"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute)
	t0 := time.Now()
	if err := w.Start(ctx, "kubelet"); err != nil {
		t.Fatal(err)
	}
	var node rig.FleetNode
	for _, n := range nodes {
		if n.Name == w.Name() {
			node = n
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := rig.Poll(wctx, 500*time.Millisecond, func(ctx context.Context) error { return d.FleetNodePublished(ctx, node) }); err != nil {
		t.Fatalf("node %s after its kubelet came back: %v", w.Name(), err)
	}
	t.Logf("FIGURE fleet: %s's kubelet down 60 s; GPUs published again %s after it started", w.Name(), time.Since(t0).Round(time.Millisecond))
	after := waitRunning(t, ctx, "app=kubelet-down", len(pods))
	for _, p := range after {
		if got := podUUID(t, ctx, p) + "/" + containerID(p); got != before[p.Name] {
			t.Errorf("pod %s on %s: GPU/container %s, was %s", p.Name, p.Spec.NodeName, got, before[p.Name])
		}
	}
}

// TestContainerdRestartOnOneNode: one worker's containerd restarts; no pod on any node
// restarts, and a new GPU pod still starts on that worker (nvinject-nri reconnected).
func TestContainerdRestartOnOneNode(t *testing.T) {
	d := need(t)
	ctx := context.Background()
	w := d.Node().Workers()[0]
	pods := runDeployment(t, ctx, "ctrd-restart", len(nodes), map[string]string{})
	before := map[string]string{}
	for _, p := range pods {
		before[p.Name] = containerID(p)
	}
	if err := w.Restart(ctx, "containerd"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	for _, p := range waitRunning(t, ctx, "app=ctrd-restart", len(pods)) {
		if containerID(p) != before[p.Name] || p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("pod %s on %s: container %s restarts %d, was %s", p.Name, p.Spec.NodeName, containerID(p), p.Status.ContainerStatuses[0].RestartCount, before[p.Name])
		}
	}
	after := runDeployment(t, ctx, "ctrd-after", 1, map[string]string{"kubernetes.io/hostname": w.Name()})
	t.Logf("FIGURE fleet: containerd of %s restarted; %d pods unchanged; a new GPU pod started there with %s", w.Name(), len(pods), podUUID(t, ctx, after[0]))
}

func containerID(p corev1.Pod) string {
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	return p.Status.ContainerStatuses[0].ContainerID
}
