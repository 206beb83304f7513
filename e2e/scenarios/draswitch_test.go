package scenarios

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/simnode"
	"github.com/nvinject/nvinject/shared/contract"
)

// switchStep is one move of the node between owners.
type switchStep struct {
	name     string // for logs and FIGURE lines
	prefix   string // of the step's pod names
	label    string // the node's DRA-mode label after the flip, "" when removed
	from, to string // the path (simnode.Path*) a GPU pod takes before and after
	// shares: measured, the pod created at the flip runs on the new owner's
	// path while the old owner's pod still has the same GPU.
	shares bool
	flip   func(context.Context) (simnode.Switch, error)
}

// TestDRASwitchPods moves the node device plugin -> DRA -> device plugin
// with GPU pods on it and records, every 100 ms, what they see: a pod
// running on the old owner when the label flips (it keeps running and its
// GPU), a seed-style nvidia.com/gpu pod created at the flip while that pod
// holds the only GPU, and one created after that pod is deleted. Moving to
// DRA, the pod created at the flip runs on the GPU the device-plugin pod
// still uses as soon as allocatable nvidia.com/gpu is 0 (nvinject-dra and the
// scheduler do not see device-plugin allocations); moving back it waits,
// Pending, until the GPU is free. deviceplugin/DRA.md ("Deploy and move a
// node") says so; change both together.
func TestDRASwitchPods(t *testing.T) {
	d := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if err := d.ImportDRAImage(ctx); err != nil {
		t.Fatal(err)
	}
	onDRA := false
	t.Cleanup(func() {
		if !onDRA {
			return
		}
		if _, err := d.SwitchToDevicePlugin(context.Background(), dep, 3*time.Minute); err != nil {
			t.Errorf("switch back to the device plugin: %v", err)
		}
	})
	steps := []switchStep{
		{name: "device plugin -> DRA", prefix: "sw-dra", label: contract.DRAModeDRA, from: simnode.PathDevicePlugin, to: simnode.PathDRA, shares: true,
			flip: func(ctx context.Context) (simnode.Switch, error) { return d.SwitchToDRA(ctx, dep, 3*time.Minute) }},
		{name: "DRA -> device plugin", prefix: "sw-dp", label: "", from: simnode.PathDRA, to: simnode.PathDevicePlugin,
			flip: func(ctx context.Context) (simnode.Switch, error) {
				return d.SwitchToDevicePlugin(ctx, dep, 3*time.Minute)
			}},
	}
	for _, st := range steps {
		onDRA = true // from the first flip on, until a switch back succeeded
		ok := t.Run(st.name, func(t *testing.T) { switchWithPods(t, ctx, d, st) })
		if !ok {
			return
		}
		onDRA = st.label != ""
	}
}

func switchWithPods(t *testing.T, ctx context.Context, d *simnode.Deployer, st switchStep) {
	holder, atFlip, afterFree := st.prefix+"-running", st.prefix+"-at-flip", st.prefix+"-after-free"
	createPod(t, ctx, holder, gpuPod)
	before := waitPod(t, ctx, holder, 2*time.Minute, "Running", running)
	if p := pathOf(before); p != st.from {
		t.Fatalf("pod %s took the %s path before the switch, want %s", holder, p, st.from)
	}
	gpusBefore := containerGPUs(t, ctx, holder)
	if !slices.Equal(gpusBefore, []string{dep.UUID}) {
		t.Fatalf("pod %s sees %v before the switch, want %s", holder, gpusBefore, dep.UUID)
	}

	o, err := d.ObserveSwitch(ctx, ns, contract.DRAModeLabel, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	o.Watch(holder)
	type flipped struct {
		sw  simnode.Switch
		err error
	}
	res := make(chan flipped, 1)
	go func() {
		sw, err := st.flip(ctx)
		res <- flipped{sw, err}
	}()
	waitFlip := sync.OnceValue(func() flipped { return <-res })
	defer waitFlip()
	var tFlip time.Time
	var tl simnode.SwitchTimeline
	stop := sync.OnceFunc(func() { tl = o.Stop() })
	defer func() {
		stop()
		if tFlip.IsZero() {
			return
		}
		t.Logf("timeline of %s, seconds from the label change seen by the API (polls every 100 ms, longest gap %s):", st.name, tl.MaxGap.Round(time.Millisecond))
		for _, l := range tl.Lines(tFlip) {
			t.Log(l)
		}
		if tl.LastErr != nil {
			t.Logf("last failed API read while observing: %v", tl.LastErr)
		}
	}()
	sec := func(at time.Time) string { return fmt.Sprintf("%+.3fs", at.Sub(tFlip).Seconds()) }

	if tFlip, err = o.WaitLabel(ctx, st.label, time.Minute); err != nil {
		t.Fatal(err)
	}
	createPod(t, ctx, atFlip, gpuPod)
	tCreated := time.Now()
	o.Watch(atFlip)
	f := waitFlip()
	if f.err != nil {
		t.Fatal(f.err)
	}
	t.Logf("FIGURE switch %s with a GPU pod running: old owner gone %s, allocatable %s at the new owner's value after %s, new owner Ready %s (from the switch's label command)",
		st.name, f.sw.OldOwnerGone.Round(time.Millisecond), simnode.Resource, f.sw.Allocatable.Round(time.Millisecond), f.sw.Ready.Round(time.Millisecond))
	// The new owner is Ready: a generous window for the pod created at the
	// flip to be scheduled, admitted or refused while the holder runs.
	watchUntil(ctx, 15*time.Second, func() bool {
		s, _ := o.Latest(atFlip)
		return s.Running() || s.Phase == corev1.PodFailed
	})
	flipState, _ := o.Latest(atFlip)
	if flipState.Running() != st.shares {
		t.Errorf("%s: pod %s created at the flip, %s after it while %s holds the GPU: %s; want running=%v (measured before; see deviceplugin/DRA.md)",
			st.name, atFlip, sec(time.Now()), holder, flipState, st.shares)
	}
	if flipState.Running() {
		got := containerGPUs(t, ctx, atFlip)
		run, _ := o.Latest(atFlip)
		t.Logf("FIGURE switch %s with a GPU pod running: pod created at the flip (%s) runs on the %s path at %s, on %v, the GPU %s still uses",
			st.name, sec(tCreated), run.Path, sec(firstRunning(o, atFlip)), got, holder)
		if !slices.Equal(got, gpusBefore) {
			t.Errorf("%s sees %v, want the only GPU %v", atFlip, got, gpusBefore)
		}
	}

	// The pod that ran on the old owner keeps running, with its GPU.
	after, err := d.Kube().Client.CoreV1().Pods(ns).Get(ctx, holder, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.UID != before.UID || !running(after) || after.Status.ContainerStatuses[0].RestartCount != before.Status.ContainerStatuses[0].RestartCount {
		t.Errorf("pod %s did not keep running through the switch: %s, restarts %d (before %d)", holder, describe(after),
			after.Status.ContainerStatuses[0].RestartCount, before.Status.ContainerStatuses[0].RestartCount)
	}
	if got := containerGPUs(t, ctx, holder); !slices.Equal(got, gpusBefore) {
		t.Errorf("pod %s sees %v after the switch, before it %v", holder, got, gpusBefore)
	}
	t.Logf("%s: %s kept running on the %s path with %v, restarts %d", st.name, holder, pathOf(after), gpusBefore, after.Status.ContainerStatuses[0].RestartCount)

	deletePod(t, holder)
	tFreed := time.Now()
	createPod(t, ctx, afterFree, gpuPod)
	o.Watch(afterFree)
	// One GPU: the pod created at the flip, already queued, takes it first.
	if !watchUntil(ctx, 2*time.Minute, func() bool { s, _ := o.Latest(atFlip); return s.Running() }) {
		t.Fatalf("%s: %s does not run 2 min after %s was deleted", st.name, atFlip, holder)
	}
	if !flipState.Running() {
		t.Logf("FIGURE switch %s with a GPU pod running: pod created at the flip (%s) Pending until %s was deleted (%s), Running %s after that",
			st.name, sec(tCreated), holder, sec(tFreed), firstRunning(o, atFlip).Sub(tFreed).Round(time.Millisecond))
	}
	deletePod(t, atFlip)
	tFreed = time.Now()
	if !watchUntil(ctx, 2*time.Minute, func() bool { s, _ := o.Latest(afterFree); return s.Running() }) {
		t.Fatalf("%s: %s does not run 2 min after %s was deleted", st.name, afterFree, atFlip)
	}
	t.Logf("FIGURE switch %s with a GPU pod running: pod created after %s was deleted Running on the %s path %s after %s was deleted (%s)",
		st.name, holder, st.to, firstRunning(o, afterFree).Sub(tFreed).Round(time.Millisecond), atFlip, sec(tFreed))
	stop()

	for _, name := range []string{atFlip, afterFree} {
		bound, _ := o.First(name, func(s simnode.PodState) bool { return s.Node != "" })
		if bound.Path != st.to {
			t.Errorf("%s: pod %s was bound on the %s path at %s, want %s", st.name, name, bound.Path, sec(bound.At), st.to)
		}
		if failed, ok := o.First(name, func(s simnode.PodState) bool { return s.Phase == corev1.PodFailed }); ok {
			t.Errorf("%s: pod %s failed at %s: %s", st.name, name, sec(failed.At), failed)
		}
	}
	reasons := map[string]int{}
	for _, e := range tl.Events {
		reasons[e.Reason]++
		switch e.Reason {
		case "UnexpectedAdmissionError", "FailedPrepareDynamicResources", "FailedCreatePodSandBox":
			t.Errorf("%s: %s for %s at %s: %s", st.name, e.Reason, e.Pod, sec(e.At), e.Message)
		}
	}
	t.Logf("%s: events by reason %v", st.name, reasons)
}

// firstRunning is when the observer first saw pod name Running.
func firstRunning(o *simnode.SwitchObserver, name string) time.Time {
	s, _ := o.First(name, simnode.PodState.Running)
	return s.At
}

// pathOf is the owner's path a bound pod took.
func pathOf(p *corev1.Pod) string {
	if p.Status.ExtendedResourceClaimStatus != nil {
		return simnode.PathDRA
	}
	return simnode.PathDevicePlugin
}

// watchUntil polls cond every 100 ms for at most timeout; it reports whether cond held.
func watchUntil(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return simnode.Poll(ctx, 100*time.Millisecond, func(context.Context) error {
		if !cond() {
			return errString("not yet")
		}
		return nil
	}) == nil
}
