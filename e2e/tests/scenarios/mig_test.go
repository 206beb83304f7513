package scenarios

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// smiUUID matches the UUIDs `nvidia-smi -L` lists in a container: GPUs and
// MIG devices, in its order.
var smiUUID = regexp.MustCompile(`\(UUID: ((?:GPU|MIG)-[0-9a-f-]+)\)`)

func smiList(t testing.TB, ctx context.Context, pod string) []string {
	t.Helper()
	out, err := need(t).Kube().Exec(ctx, ns, pod, "", "nvidia-smi-sim", "-L")
	if err != nil {
		t.Fatalf("nvidia-smi -L in %s: %v", pod, err)
	}
	var uuids []string
	for _, m := range smiUUID.FindAllStringSubmatch(out, -1) {
		uuids = append(uuids, m[1])
	}
	return uuids
}

// capsNodes lists the container's /dev/nvidia-caps; nil when it has none.
func capsNodes(t testing.TB, ctx context.Context, pod string) []string {
	t.Helper()
	out, err := need(t).Kube().Exec(ctx, ns, pod, "", "sh", "-c", "ls "+contract.CapsDir+" 2>/dev/null || true")
	if err != nil {
		t.Fatalf("list %s in %s: %v", contract.CapsDir, pod, err)
	}
	return strings.Fields(out)
}

// migOf finds the MIG device with uuid on node.
func migOf(node gpu.Node, uuid string) (gpu.Device, gpu.MIGDevice, bool) {
	for _, d := range node.Devices {
		for _, m := range d.MIG {
			if m.UUID == uuid {
				return d, m, true
			}
		}
	}
	return gpu.Device{}, gpu.MIGDevice{}, false
}

// checkMIGPod checks that pod sees exactly one MIG device of profile (its
// parent GPU and it in nvidia-smi, its GI and CI access nodes and no
// other) and returns its UUID.
func checkMIGPod(t *testing.T, ctx context.Context, node gpu.Node, pod, profile string) string {
	t.Helper()
	seen := smiList(t, ctx, pod)
	if len(seen) != 2 {
		t.Errorf("pod %s: nvidia-smi -L lists %v, want its MIG device's parent and the MIG device", pod, seen)
		return ""
	}
	parent, m, ok := migOf(node, seen[1])
	if !ok || parent.UUID != seen[0] || m.Profile != profile {
		t.Errorf("pod %s sees %v: not one %s MIG device under its parent (found %v, profile %q)", pod, seen, profile, ok, m.Profile)
		return ""
	}
	want := []string{strings.TrimPrefix(m.GIAccess.Path, contract.CapsDir+"/"), strings.TrimPrefix(m.CIAccess.Path, contract.CapsDir+"/")}
	slices.Sort(want)
	if got := capsNodes(t, ctx, pod); !slices.Equal(got, want) {
		t.Errorf("pod %s has %s %v, want exactly its MIG device's %v", pod, contract.CapsDir, got, want)
	}
	return m.UUID
}

// deployFor deploys g for the test and restores the suite's 1-GPU
// deployment when it ends.
func deployFor(t *testing.T, ctx context.Context, g rig.GPUs) rig.Deployment {
	t.Helper()
	d := need(t)
	t.Cleanup(func() {
		if _, err := d.Deploy(context.Background(), dep.GPUs); err != nil {
			t.Errorf("restore the 1-GPU deployment: %v", err)
		}
	})
	got, err := d.Deploy(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// createGPUPods creates n GPU pods named by format and i, one after another
// without waiting, and returns their names.
func createGPUPods(t *testing.T, ctx context.Context, format string, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf(format, i)
		createPod(t, ctx, names[i], gpuPod)
	}
	return names
}

// splitPods waits until n of the pods named run and the rest are
// Unschedulable, and returns the two lists.
func splitPods(t *testing.T, ctx context.Context, names []string, n int) (runningPods, waiting []string) {
	t.Helper()
	err := rig.Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		runningPods, waiting = nil, nil
		for _, name := range names {
			p, err := need(t).Kube().Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			switch {
			case running(p):
				runningPods = append(runningPods, name)
			case unschedulable(p):
				waiting = append(waiting, name)
			}
		}
		if len(runningPods) != n || len(waiting) != len(names)-n {
			return fmt.Errorf("%d Running, %d Unschedulable", len(runningPods), len(waiting))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%d pods on %d devices: %v", len(names), n, err)
	}
	return runningPods, waiting
}

func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// MIG_STRATEGY=mixed on an A100 node with GPU 0 whole and GPU 1 split into
// one 3g.40gb and two 1g.10gb MIG devices: each resource is published with
// NVIDIA's name, pods of two profiles and a whole-GPU pod run side by side
// on one node, each sees exactly its allocation, and a third 1g.10gb pod
// waits.
func TestMIGMixed(t *testing.T) {
	ctx := testCtx(t)
	const nvml = "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb*2"
	small, big := contract.MIGResourceName(rig.Resource, "1g.10gb"), contract.MIGResourceName(rig.Resource, "3g.40gb")
	t0 := time.Now()
	deployFor(t, ctx, rig.GPUs{NVML: nvml, All: true, MIGStrategy: "mixed",
		Expect: map[string]int64{rig.Resource: 1, small: 2, big: 1}})
	t.Logf("FIGURE MIG mixed: %s published as %s=1 %s=2 %s=1 in %s", nvml, rig.Resource, small, big, time.Since(t0).Round(100*time.Millisecond))
	node, err := rig.SimulatedGPUs(ctx, nvml)
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]string{"mig-small-a": small, "mig-small-b": small, "mig-big": big, "mig-whole": rig.Resource}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range pods {
			if !yield(k) {
				return
			}
		}
	}) {
		createPod(t, ctx, name, podSpec{gpu: true, runtimeClass: true, resource: pods[name]})
	}
	for name := range pods {
		waitPod(t, ctx, name, 2*time.Minute, "Running", running)
	}
	a, b := checkMIGPod(t, ctx, node, "mig-small-a", "1g.10gb"), checkMIGPod(t, ctx, node, "mig-small-b", "1g.10gb")
	if a != "" && a == b {
		t.Errorf("two pods got the same MIG device %s", a)
	}
	checkMIGPod(t, ctx, node, "mig-big", "3g.40gb")
	if got := smiList(t, ctx, "mig-whole"); !slices.Equal(got, []string{node.Devices[0].UUID}) {
		t.Errorf("whole-GPU pod sees %v, want only GPU 0 %s", got, node.Devices[0].UUID)
	}
	if got := capsNodes(t, ctx, "mig-whole"); len(got) != 0 {
		t.Errorf("whole-GPU pod has MIG access nodes %v", got)
	}
	createPod(t, ctx, "mig-small-c", podSpec{gpu: true, runtimeClass: true, resource: small})
	waitPod(t, ctx, "mig-small-c", time.Minute, "Unschedulable", unschedulable)
}

// MIG_STRATEGY=single on an A100 split into seven 1g.10gb MIG devices:
// they are the node's nvidia.com/gpu, eight pods created at once get seven
// distinct MIG devices and the eighth waits; then the example vLLM
// Deployment runs on one of them.
func TestMIGSingleSevenAtOnce(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	const nvml = "sim:a100-80gb,mig=0:1g.10gb*7"
	deployFor(t, ctx, rig.GPUs{NVML: nvml, MIGStrategy: "single", Expect: map[string]int64{rig.Resource: 7}})
	node, err := rig.SimulatedGPUs(ctx, nvml)
	if err != nil {
		t.Fatal(err)
	}
	names := createGPUPods(t, ctx, "mig-seven-%d", 8)
	runningPods, waiting := splitPods(t, ctx, names, 7)
	seen := map[string]string{}
	for _, n := range runningPods {
		u := checkMIGPod(t, ctx, node, n, "1g.10gb")
		if other, dup := seen[u]; dup && u != "" {
			t.Errorf("pods %s and %s share MIG device %s", other, n, u)
		}
		seen[u] = n
	}
	t.Logf("FIGURE MIG single: 8 pods created at once on %s: 7 Running on %d distinct MIG devices, %s Unschedulable", nvml, len(seen), waiting[0])
	deletePod(t, waiting[0])
	deletePod(t, runningPods[0])
	pod, err := d.RunVLLM(ctx, 3*time.Minute)
	if err != nil {
		t.Fatalf("the example vLLM Deployment on a single-strategy MIG node: %v", err)
	}
	t.Cleanup(func() { _ = d.DeleteVLLM(context.Background()) })
	checkMIGPod(t, ctx, node, pod.Name, "1g.10gb")
}

// Time-slicing (the ConfigMap nvinject-sharing, NVIDIA's format): one GPU
// published as four replicas; four pods created at once all run on it,
// each seeing only it; a fifth waits.
func TestTimeSlicingFourPodsOnOneGPU(t *testing.T) {
	ctx := testCtx(t)
	const sharing = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}"
	shared := deployFor(t, ctx, rig.GPUs{NVML: rig.DefaultNVML, Sharing: sharing, Expect: map[string]int64{rig.Resource: 4}})
	names := createGPUPods(t, ctx, "sliced-%d", 5)
	runningPods, waiting := splitPods(t, ctx, names, 4)
	for _, n := range runningPods {
		if got := containerGPUs(t, ctx, n); !slices.Equal(got, []string{shared.UUID}) {
			t.Errorf("pod %s sees %v, want only the shared GPU %s", n, got, shared.UUID)
		}
	}
	t.Logf("FIGURE time-slicing: 5 pods created at once on 1 GPU with 4 replicas: %d Running on %s, %s Unschedulable", len(runningPods), shared.UUID, waiting[0])
}

// Sixteen pods created at once over eight GPUs of two replicas each: all
// run, each GPU reaches exactly two of them, a seventeenth waits.
func TestTimeSlicingSixteenOverEight(t *testing.T) {
	ctx := testCtx(t)
	const sharing = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}"
	deployFor(t, ctx, rig.GPUs{NVML: "sim:a100-80gb*8", All: true, Sharing: sharing, Expect: map[string]int64{rig.Resource: 16}})
	names := createGPUPods(t, ctx, "sliced8-%02d", 17)
	runningPods, waiting := splitPods(t, ctx, names, 16)
	per := map[string][]string{}
	for _, n := range runningPods {
		got := containerGPUs(t, ctx, n)
		if len(got) != 1 {
			t.Errorf("pod %s sees %v, want one GPU", n, got)
			continue
		}
		per[got[0]] = append(per[got[0]], n)
	}
	for u, pods := range per {
		if len(pods) != 2 {
			t.Errorf("GPU %s reaches %v, want exactly 2 pods", u, pods)
		}
	}
	if len(per) != 8 {
		t.Errorf("pods reach %d GPUs, want 8", len(per))
	}
	t.Logf("FIGURE time-slicing: 17 pods created at once on 8 GPUs x 2 replicas: 16 Running, 2 per GPU on %d GPUs, %s Unschedulable", len(per), waiting[0])
}

// On the DRA path, the same A100 node (GPU 0 whole, GPU 1 split into one
// 3g.40gb and two 1g.10gb) moved to nvinject-dra: claims select MIG devices
// by profile with CEL. Two 1g.10gb claims get the two distinct 1g.10gb MIG
// devices, a whole-GPU claim GPU 0, each seeing exactly its allocation; a
// third 1g.10gb claim waits, and a whole-GPU claim cannot take GPU 1, whose
// slices the counters give away (KEP-4815).
func TestDRAMIGClaimByProfile(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	if err := d.ImportDRAImage(ctx); err != nil {
		t.Fatal(err)
	}
	const nvml = "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb*2"
	small, big := contract.MIGResourceName(rig.Resource, "1g.10gb"), contract.MIGResourceName(rig.Resource, "3g.40gb")
	mig := deployFor(t, ctx, rig.GPUs{NVML: nvml, All: true, MIGStrategy: "mixed", Expect: map[string]int64{rig.Resource: 1, small: 2, big: 1}})
	sw, err := d.SwitchToDRA(ctx, mig, 3*time.Minute)
	t.Cleanup(func() {
		if _, err := d.SwitchToDevicePlugin(context.Background(), mig, 3*time.Minute); err != nil {
			t.Errorf("switch back to the device plugin: %v", err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE DRA MIG: %s moved to nvinject-dra, Ready with its slices after %s", nvml, sw.Ready.Round(time.Millisecond))
	node, err := rig.SimulatedGPUs(ctx, nvml)
	if err != nil {
		t.Fatal(err)
	}
	attr := `device.attributes["` + contract.DRADriver + `"].`
	createCELTemplate(t, ctx, "mig-1g", attr+contract.DRAAttrType+` == "`+contract.DRATypeMIG+`" && `+attr+contract.DRAAttrProfile+` == "1g.10gb"`)
	createCELTemplate(t, ctx, "whole-gpu", attr+contract.DRAAttrType+` == "`+contract.DRATypeGPU+`"`)
	// The first claim alone: claim → Running on a pre-made instance, the
	// anchor of TestDRAMIGOnDemand's figure when both run together.
	t0 := time.Now()
	createDRAPod(t, ctx, "dra-mig-a", podSpec{runtimeClass: true}, "mig-1g")
	waitPod(t, ctx, "dra-mig-a", 2*time.Minute, "Running", running)
	t.Logf("FIGURE DRA MIG pre-made: a 1g.10gb claim on a pre-made instance, pod create → Running %s", time.Since(t0).Round(time.Millisecond))
	for _, p := range [][2]string{{"dra-mig-b", "mig-1g"}, {"dra-whole", "whole-gpu"}} {
		createDRAPod(t, ctx, p[0], podSpec{runtimeClass: true}, p[1])
	}
	for _, n := range []string{"dra-mig-b", "dra-whole"} {
		waitPod(t, ctx, n, 2*time.Minute, "Running", running)
	}
	a, b := checkMIGPod(t, ctx, node, "dra-mig-a", "1g.10gb"), checkMIGPod(t, ctx, node, "dra-mig-b", "1g.10gb")
	if a != "" && a == b {
		t.Errorf("two claims got the same MIG device %s", a)
	}
	if got := smiList(t, ctx, "dra-whole"); !slices.Equal(got, []string{node.Devices[0].UUID}) {
		t.Errorf("whole-GPU claim pod sees %v, want only GPU 0 %s", got, node.Devices[0].UUID)
	}
	createDRAPod(t, ctx, "dra-mig-c", podSpec{runtimeClass: true}, "mig-1g")
	createDRAPod(t, ctx, "dra-whole-2", podSpec{runtimeClass: true}, "whole-gpu")
	waitPod(t, ctx, "dra-mig-c", time.Minute, "Unschedulable", unschedulable)
	waitPod(t, ctx, "dra-whole-2", time.Minute, "Unschedulable", unschedulable)
	t.Logf("FIGURE DRA MIG by profile: 2 claims on distinct 1g.10gb devices %s %s, a whole-GPU claim on GPU 0; a third 1g.10gb claim and a whole-GPU claim for the sliced GPU 1 Unschedulable", a, b)
}

// createCELTemplate creates ResourceClaimTemplate name asking for one
// device of nvinject's DeviceClass that expr selects.
func createCELTemplate(t *testing.T, ctx context.Context, name, expr string) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: contract.DRADriver,
				Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}},
			}}},
		}}},
	}
	c := need(t).Kube().Client.ResourceV1().ResourceClaimTemplates(ns)
	if _, err := c.Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaimTemplate %s: %v", name, err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// A MIG layout changed while nvinject runs (MIG_STRATEGY=mixed, A100 GPU 1
// split 3g.40gb + 2×1g.10gb, one 1g.10gb held by a running pod): the
// operator destroys the 3g.40gb and creates two 2g.20gb in its place
// (sim-mig, nvidia-smi mig's syntax, on the SIMULATED driver).
// Without a restart of either daemon the node then publishes
// nvidia.com/mig-2g.20gb=2 and no 3g.40gb, two pods get the two new MIG
// devices (nvinject-nri reads its inventory again for the one it has never
// seen), and the held pod keeps its slice throughout.
func TestMIGLayoutChangeAtRuntime(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	const nvml = "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb*2"
	small, big, mid := contract.MIGResourceName(rig.Resource, "1g.10gb"), contract.MIGResourceName(rig.Resource, "3g.40gb"), contract.MIGResourceName(rig.Resource, "2g.20gb")
	deployFor(t, ctx, rig.GPUs{NVML: nvml, All: true, MIGStrategy: "mixed", Expect: map[string]int64{rig.Resource: 1, small: 2, big: 1}})
	node, err := rig.SimulatedGPUs(ctx, nvml)
	if err != nil {
		t.Fatal(err)
	}
	createPod(t, ctx, "relayout-held", podSpec{gpu: true, runtimeClass: true, resource: small})
	waitPod(t, ctx, "relayout-held", 2*time.Minute, "Running", running)
	held := checkMIGPod(t, ctx, node, "relayout-held", "1g.10gb")
	gi := -1
	for _, m := range node.Devices[1].MIG {
		if m.Profile == "3g.40gb" {
			gi = m.GPUInstance
		}
	}
	before := map[string]*corev1.Pod{}
	for _, ds := range []string{rig.DevicePlugin, rig.NRIPlugin} {
		p, err := d.DaemonSetPod(ctx, ds)
		if err != nil {
			t.Fatal(err)
		}
		before[ds] = p
	}

	t0 := time.Now()
	out, err := d.DestroyMIG(ctx, nvml, 1, gi)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("$ sim-mig mig -dci -dgi -i 1 -gi %d\n%s", gi, out)
	if out, err = d.ChangeMIG(ctx, nvml, 1, "2g.20gb", "2g.20gb"); err != nil {
		t.Fatal(err)
	}
	t.Logf("$ sim-mig mig -cgi 2g.20gb,2g.20gb -C -i 1\n%s", out)
	created := regexp.MustCompile(`MIG-[0-9a-f-]{36}`).FindAllString(out, -1)
	if len(created) != 2 {
		t.Fatalf("want two new MIG UUIDs in %q", out)
	}
	want := map[string]int64{rig.Resource: 1, small: 2, big: 0, mid: 2}
	err = rig.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		n, err := d.Kube().Client.CoreV1().Nodes().Get(ctx, d.Node().Name(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		for res, w := range want {
			if a := n.Status.Allocatable[corev1.ResourceName(res)]; a.Value() != w {
				return fmt.Errorf("%s allocatable %d, want %d", res, a.Value(), w)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the changed layout was not republished: %v", err)
	}
	republished := time.Since(t0)

	got := map[string]string{}
	for _, n := range []string{"relayout-new-a", "relayout-new-b"} {
		createPod(t, ctx, n, podSpec{gpu: true, runtimeClass: true, resource: mid})
	}
	for _, n := range []string{"relayout-new-a", "relayout-new-b"} {
		waitPod(t, ctx, n, 2*time.Minute, "Running", running)
		env, err := d.Kube().Exec(ctx, ns, n, "", "sh", "-c", "env | grep "+contract.EnvMIGUUIDPrefix)
		_, uuid, _ := strings.Cut(strings.TrimSpace(env), "=")
		if err != nil || !slices.Contains(created, uuid) || strings.Contains(strings.TrimSpace(env), "\n") {
			t.Errorf("pod %s on a new 2g.20gb device has MIG env %q (%v), want one of %v", n, env, err, created)
		}
		if other, dup := got[uuid]; dup {
			t.Errorf("pods %s and %s share MIG device %s", other, n, uuid)
		}
		got[uuid] = n
	}
	if p, err := d.Kube().Client.CoreV1().Pods(ns).Get(ctx, "relayout-held", metav1.GetOptions{}); err != nil || !running(p) {
		t.Errorf("the pod holding %s is no longer Running: %v", held, err)
	}
	if now := checkMIGPod(t, ctx, node, "relayout-held", "1g.10gb"); now != held {
		t.Errorf("the held pod's slice changed from %s to %s", held, now)
	}
	for ds, p := range before {
		now, err := d.DaemonSetPod(ctx, ds)
		if err != nil {
			t.Fatal(err)
		}
		if now.UID != p.UID || now.Status.ContainerStatuses[0].RestartCount != p.Status.ContainerStatuses[0].RestartCount {
			t.Errorf("%s restarted across the layout change (pod %s -> %s)", ds, p.UID, now.UID)
		}
	}
	t.Logf("FIGURE MIG layout change at runtime: 3g.40gb destroyed and 2×2g.20gb created on GPU 1 while a pod held a 1g.10gb: republished (%s=2, %s=0) %s after the first sim-mig command, no daemon restarted; two pods got %v", mid, big, republished.Round(100*time.Millisecond), created)
}
