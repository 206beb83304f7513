package multinode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/fleet/move"
	"github.com/nvinject/nvinject/shared/contract"
)

// nvinjectMove runs the real nvinject-move against the fleet and returns its reports.
func nvinjectMove(t *testing.T, ctx context.Context, args ...string) ([]move.Report, error) {
	t.Helper()
	d := need(t)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, d.Bin("nvinject-move"), append(append(args[:1:1], "--kubeconfig="+d.Kube().Kubeconfig, "--json", "--timeout=3m"), args[1:]...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var reports []move.Report
	if jerr := json.Unmarshal(stdout.Bytes(), &reports); jerr != nil {
		t.Fatalf("nvinject-move %v: %v; stdout %q stderr %s", args, jerr, stdout.String(), stderr.String())
	}
	if err != nil {
		t.Logf("nvinject-move %v: %v\n%s", args, err, stderr.String())
	}
	return reports, err
}

func logSteps(t *testing.T, r move.Report) {
	t.Helper()
	var parts []string
	for _, s := range r.Steps {
		parts = append(parts, s.Name+" "+s.Took.Round(time.Millisecond).String())
	}
	t.Logf("FIGURE %s %s %s -> %s: %s", r.Action, r.Node, r.From, r.To, strings.Join(parts, ", "))
}

// onNodeWithOwnGPUs checks that pods all run on n with distinct GPUs of n's own.
func onNodeWithOwnGPUs(t *testing.T, ctx context.Context, n rig.FleetNode, selector string, want int) {
	t.Helper()
	pods := waitRunning(t, ctx, selector, want)
	list, err := need(t).Kube().Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != want {
		var names []string
		for _, p := range list.Items {
			names = append(names, p.Name+":"+string(p.Status.Phase))
		}
		t.Errorf("pods %s: %v; want exactly %d, none stuck", selector, names, want)
	}
	own := uuidsOf(t, n)
	seen := map[string]string{}
	for _, p := range pods {
		if p.Spec.NodeName != n.Name {
			t.Errorf("pod %s runs on %s, want %s", p.Name, p.Spec.NodeName, n.Name)
		}
		u := podUUID(t, ctx, p)
		if !slices.Contains(own, u) {
			t.Errorf("pod %s on %s has GPU %s, not one of the node's", p.Name, n.Name, u)
		}
		if other, dup := seen[u]; dup {
			t.Errorf("GPU %s given to %s and %s", u, other, p.Name)
		}
		seen[u] = p.Name
	}
}

// A node moves from DRA to the device plugin and back with GPU pods running: the
// refusal while claims are prepared, the drain, every step timed, the pods back on
// the node each with its own GPU, and a second move that does nothing.
func TestMoveANodeBothWaysUnderGPUPods(t *testing.T) {
	d := need(t)
	ctx := context.Background()
	var n rig.FleetNode
	for _, c := range nodes {
		if c.Mode == contract.DRAModeDRA {
			n = c
		}
	}
	const app, replicas = "moving", 3
	selector := map[string]string{contract.GFDLabelProduct: products[model(n)]}
	runDeployment(t, ctx, app, replicas, selector)
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns}, Spec: policyv1.PodDisruptionBudgetSpec{
		MaxUnavailable: new(intstr.FromInt32(replicas)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}}}
	if _, err := d.Kube().Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Kube().Client.PolicyV1().PodDisruptionBudgets(ns).Delete(context.Background(), app, metav1.DeleteOptions{})
		// Leave the fleet as the other tests expect it.
		if _, err := nvinjectMove(t, context.Background(), "move", n.Name, "--to="+contract.DRAModeDRA); err != nil {
			t.Errorf("restore %s to DRA: %v", n.Name, err)
		}
	})

	r, err := nvinjectMove(t, ctx, "move", n.Name, "--to="+contract.DRAModeDevicePlugin)
	if err == nil || len(r) != 1 || !strings.Contains(r[0].Error, "--drain-claims") {
		t.Fatalf("move back with claims prepared: %+v, %v; want a refusal naming --drain-claims", r, err)
	}
	node, err := d.Kube().Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !node.Spec.Unschedulable || node.Annotations[move.Failed] == "" || node.Labels[contract.DRAModeLabel] != contract.DRAModeDRA {
		t.Errorf("refused node: unschedulable %t, %s=%q, mode %s; want cordoned with the reason, still DRA", node.Spec.Unschedulable, move.Failed, node.Annotations[move.Failed], node.Labels[contract.DRAModeLabel])
	}

	dp := n
	dp.Mode = contract.DRAModeDevicePlugin
	for _, step := range []struct {
		to   rig.FleetNode
		args []string
	}{
		{dp, []string{"--to=" + contract.DRAModeDevicePlugin, "--drain-claims"}},
		{n, []string{"--to=" + contract.DRAModeDRA}},
	} {
		r, err := nvinjectMove(t, ctx, append([]string{"move", n.Name}, step.args...)...)
		if err != nil || len(r) != 1 || r[0].NoOp {
			t.Fatalf("move %s %v: %+v, %v", n.Name, step.args, r, err)
		}
		logSteps(t, r[0])
		if err := d.FleetNodePublished(ctx, step.to); err != nil {
			t.Errorf("after the move to %s: %v", step.to.Mode, err)
		}
		node, err := d.Kube().Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Spec.Unschedulable || node.Annotations[move.CordonedBy] != "" || node.Annotations[move.Failed] != "" {
			t.Errorf("after the move to %s: unschedulable %t annotations %v", step.to.Mode, node.Spec.Unschedulable, node.Annotations)
		}
		onNodeWithOwnGPUs(t, ctx, step.to, "app="+app, replicas)
	}
	again, err := nvinjectMove(t, ctx, "move", n.Name, "--to="+contract.DRAModeDRA)
	if err != nil || len(again) != 1 || !again[0].NoOp {
		t.Errorf("second move to DRA: %+v, %v; want a no-op", again, err)
	}
}

// The fleet doctor's table over the real fleet: every node ok, exit 0; a node left
// cordoned by a failed move is broken at its first layer, exit 1.
func TestFleetDoctor(t *testing.T) {
	d := need(t)
	ctx := context.Background()
	doctor := func() ([]map[string]any, int) {
		cmd := exec.CommandContext(ctx, d.Bin("nvinject-doctor"), "--all-nodes", "--json", "--kubeconfig="+d.Kube().Kubeconfig)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var rows []map[string]any
		if jerr := json.Unmarshal(out, &rows); jerr != nil {
			t.Fatalf("nvinject-doctor --all-nodes --json: %v (%v): %q %s", jerr, err, out, stderr.String())
		}
		return rows, cmd.ProcessState.ExitCode()
	}
	rows, code := doctor()
	if code != 0 || len(rows) != len(nodes) {
		t.Errorf("fleet doctor: exit %d, rows %v; want %d ok rows and exit 0", code, rows, len(nodes))
	}
	for _, r := range rows {
		if r["status"] != "ok" || r["gpusPublished"] != float64(8) || r["gpusHealthy"] != float64(8) {
			t.Errorf("fleet doctor row %v; want ok with 8 of 8 GPUs", r)
		}
	}
	victim := nodes[len(nodes)-1].Name
	patch := `{"metadata":{"annotations":{"` + move.Failed + `":"simulated: the upgrade command failed"}},"spec":{"unschedulable":true}}`
	nodesAPI := d.Kube().Client.CoreV1().Nodes()
	if _, err := nodesAPI.Patch(ctx, victim, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		undo := `{"metadata":{"annotations":{"` + move.Failed + `":null}},"spec":{"unschedulable":false}}`
		if _, err := nodesAPI.Patch(context.Background(), victim, "application/merge-patch+json", []byte(undo), metav1.PatchOptions{}); err != nil {
			t.Error(err)
		}
	})
	rows, code = doctor()
	if code != 1 {
		t.Errorf("fleet doctor with a failed move: exit %d; want 1", code)
	}
	for _, r := range rows {
		broken := r["status"] != "ok"
		if (r["node"] == victim) != broken || (broken && (r["layer"] != "node" || !strings.Contains(fmt.Sprint(r["reason"]), "upgrade command failed"))) {
			t.Errorf("fleet doctor row %v; want only %s broken, at layer node, quoting the annotation", r, victim)
		}
	}
}
