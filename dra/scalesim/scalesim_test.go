package scalesim

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/dra/internal/driver"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/contract"
)

func TestNodesHaveGPUsOfTheirOwn(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	uuids := map[string]string{}
	for _, name := range []string{"gpu-0001", "gpu-0002"} {
		n, err := NewNode(ctx, name, "sim:h100-80gb*8", dir)
		if err != nil {
			t.Fatal(err)
		}
		if n.GPUs() != 8 {
			t.Errorf("%s publishes %d devices, want 8", name, n.GPUs())
		}
		if got := n.Labels()[contract.GFDLabelProduct]; got == "" {
			t.Errorf("%s has no %s label: %v", name, contract.GFDLabelProduct, n.Labels())
		}
		pool, ok := n.Resources().Pools[name]
		if !ok || len(pool.Slices) != 1 || len(pool.Slices[0].Devices) != 8 {
			t.Fatalf("%s resources = %+v, want one pool named after the node with one slice of 8 devices", name, n.Resources())
		}
		for _, d := range pool.Slices[0].Devices {
			u := *d.Attributes[contract.DRAAttrUUID].StringValue
			if other, dup := uuids[u]; dup {
				t.Errorf("GPU %s is on %s and %s", u, other, name)
			}
			uuids[u] = name
		}
	}
}

func TestPublishWritesTheNodesSlice(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0001", UID: "uid-1"}}
	client := fake.NewClientset(node)
	n, err := NewNode(ctx, node.Name, "sim:a100-80gb*8", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := n.Publish(ctx, client, func(node string, err error) { t.Errorf("publish %s: %v", node, err) })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) == 1 {
			s := list.Items[0].Spec
			if s.Driver != contract.DRADriver || s.NodeName == nil || *s.NodeName != node.Name || len(s.Devices) != 8 {
				t.Fatalf("slice = %+v, want driver %s, node %s, 8 devices", s, contract.DRADriver, node.Name)
			}
			if o := list.Items[0].OwnerReferences; len(o) != 1 || o[0].UID != node.UID {
				t.Errorf("slice owners = %v, want the Node", o)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ResourceSlices after 10s, want 1", len(list.Items))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSetReportedTaintsTheUnhealthyGPU(t *testing.T) {
	n, err := NewNode(context.Background(), "gpu-0001", "sim:h100-80gb*8", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	count := func(states []health.State) map[string]int {
		out := map[string]int{}
		for _, s := range n.SetReported(states).Pools[n.Name()].Slices[0].Devices {
			for _, tn := range s.Taints {
				out[tn.Key+"="+tn.Value]++
			}
		}
		return out
	}
	states := n.Reported()
	if len(states) != 8 || !states[0].Healthy {
		t.Fatalf("reported = %+v, want 8 Healthy GPUs", states)
	}
	states[3] = health.State{UUID: states[3].UUID, Reason: "Xid 48: double-bit ECC error"}
	if got := count(states); len(got) != 1 || got[contract.DRATaintKey+"="+driver.TaintXid] != 1 {
		t.Errorf("one GPU with an Xid: taints %v, want one %s=%s", got, contract.DRATaintKey, driver.TaintXid)
	}
	states[3] = health.State{UUID: states[3].UUID, Healthy: true}
	if got := count(states); len(got) != 0 {
		t.Errorf("recovered: taints %v, want none", got)
	}
}
