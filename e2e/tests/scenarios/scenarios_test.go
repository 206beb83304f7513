package scenarios

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// (a) The vLLM stand-in runs on exactly the selected GPU.
func TestGPUPodGetsSelectedGPU(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	pod := runVLLMOnSelectedGPU(t, ctx, d)
	reply, err := rig.Complete(ctx, pod.Status.PodIP)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reply, `"text":`) || strings.Count(reply, "GPU-") != strings.Count(reply, dep.UUID) {
		t.Errorf("completion reply names other GPUs than %s: %s", dep.UUID, reply)
	}
}

// (b) With the one GPU taken, a second GPU pod stays Pending: Insufficient nvidia.com/gpu.
func TestSecondGPUPodPending(t *testing.T) {
	ctx := testCtx(t)
	createPod(t, ctx, "gpu-holder", gpuPod)
	waitPod(t, ctx, "gpu-holder", 2*time.Minute, "Running", running)
	createPod(t, ctx, "gpu-second", gpuPod)
	msg := waitEvent(t, ctx, "gpu-second", "FailedScheduling", "Insufficient nvidia.com/gpu")
	p := waitPod(t, ctx, "gpu-second", 5*time.Second, "Pending and unbound", func(p *corev1.Pod) bool {
		return p.Status.Phase == "Pending" && p.Spec.NodeName == ""
	})
	t.Logf("second pod %s: %s", describe(p), msg)
}

// (e) An Xid makes the GPU unhealthy (allocatable 0, capacity 1); recovery brings it back.
func TestXidDropsAllocatable(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	if err := d.SimDebug(ctx, "xid", "uuid="+dep.UUID+"&xid=79"); err != nil {
		t.Fatal(err)
	}
	recovered := false
	t.Cleanup(func() {
		if !recovered {
			_ = d.SimDebug(context.Background(), "recover", "uuid="+dep.UUID)
		}
	})
	took := waitAllocatable(t, ctx, 1, 0, 30*time.Second)
	t.Logf("Xid 79: allocatable 0 after %s", took.Round(time.Millisecond))
	if err := d.SimDebug(ctx, "recover", "uuid="+dep.UUID); err != nil {
		t.Fatal(err)
	}
	recovered = true
	took = waitAllocatable(t, ctx, 1, 1, 30*time.Second)
	t.Logf("recovered: allocatable 1 after %s", took.Round(time.Millisecond))
}

// (f) A GPU pod without runtimeClassName: nvidia is refused by nvinject-nri,
// although containerd's own CDI would inject the device plugin's names.
func TestNoRuntimeClassRefused(t *testing.T) {
	ctx := testCtx(t)
	createPod(t, ctx, "gpu-no-rc", podSpec{gpu: true})
	p := waitPod(t, ctx, "gpu-no-rc", 2*time.Minute, "CreateContainerError", createError)
	_, msg := waitingReason(p)
	if !strings.Contains(msg, "runtimeClassName: nvidia") || !strings.Contains(msg, "nvinject") {
		t.Errorf("CreateContainerError message = %q, want nvinject's refusal naming runtimeClassName: nvidia", msg)
	}
}

// (d) A kubelet restart: the plugin re-registers by itself, capacity comes back
// within seconds, the GPU stays healthy and the plugin process is not restarted.
func TestKubeletRestart(t *testing.T) {
	d := need(t)
	failOnKubeletRefusedRegister(t)
	ctx := testCtx(t)
	before, err := d.DaemonSetPod(ctx, rig.DevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	regs := registrations(t, ctx)
	t0 := time.Now()
	if err := d.Node().Restart(ctx, "kubelet"); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet restarted (healthy) in %s", time.Since(t0).Round(time.Millisecond))
	err = rig.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		if n := registrations(t, ctx); n <= regs {
			return errString("device plugin has not re-registered (registrations ok=" + strconv.Itoa(n) + ")")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WaitKubeletAllocatable(ctx, dep.DeviceID, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitAllocatable(t, ctx, 1, 1, 30*time.Second)
	total := time.Since(t0)
	t.Logf("re-registered; kubelet offers %s again and Node allocatable is 1, %s after the restart began", dep.UUID, total.Round(time.Millisecond))
	if total > 30*time.Second {
		t.Errorf("capacity took %s to come back, want seconds", total)
	}
	after, err := d.DaemonSetPod(ctx, rig.DevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	if after.UID != before.UID || restarts(after) != restarts(before) {
		t.Errorf("the device plugin was restarted (pod %s restarts %d -> pod %s restarts %d); it should only re-register",
			before.Name, restarts(before), after.Name, restarts(after))
	}
	m, err := d.Metrics(ctx, rig.DevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(m, `uuid="`+dep.UUID+`"} 1`) {
		t.Errorf("GPU %s not healthy after the kubelet restart", dep.UUID)
	}
	// An allocation proves the restarted kubelet's device manager has the
	// plugin again. A Deployment, as users run GPU apps: kubelet may reject
	// a pod admitted in its first seconds (UnexpectedAdmissionError, from
	// checkpointed allocations of deleted pods it has not yet cleaned up),
	// and the ReplicaSet replaces it.
	runVLLMOnSelectedGPU(t, ctx, d)
	pods, err := d.Kube().Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: rig.VLLMSelector})
	if err != nil {
		t.Fatal(err)
	}
	rejected := 0
	for _, p := range pods.Items {
		if p.Status.Reason == "UnexpectedAdmissionError" {
			rejected++
		}
	}
	t.Logf("vLLM stand-in Ready on %s after the kubelet restart; kubelet rejected %d earlier pod(s) with UnexpectedAdmissionError", dep.UUID, rejected)
}

// (c) On a simulated 8-GPU node only the selected GPU (index 5) is published,
// and a GPU pod gets exactly it.
func TestEightGPUNodePublishesSelected(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	t.Cleanup(func() {
		if _, err := d.Deploy(context.Background(), dep.GPUs); err != nil {
			t.Errorf("restore the 1-GPU deployment: %v", err)
		}
	})
	eight, err := d.Deploy(ctx, rig.GPUs{NVML: "sim:a100-80gb*8", Selected: 5})
	if err != nil {
		t.Fatal(err)
	}
	host, err := d.HostGPUs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(host) != 8 || host[5].UUID != eight.UUID {
		t.Fatalf("host GPUs %v, want 8 with GPU 5 = %s", host, eight.UUID)
	}
	waitAllocatable(t, ctx, 1, 1, 30*time.Second)
	createPod(t, ctx, "gpu-of-eight", gpuPod)
	waitPod(t, ctx, "gpu-of-eight", 2*time.Minute, "Running", running)
	if got := containerGPUs(t, ctx, "gpu-of-eight"); !slices.Equal(got, []string{eight.UUID}) {
		t.Errorf("pod sees %v, want only GPU 5 %s", got, eight.UUID)
	}
}

// DEVICE_ID_STRATEGY=index: kubelet assigns and reports GPU indices, and
// nvinject-nri's PodResources check still matches them to the UUID it injects.
func TestIndexDeviceIDsPassTheUUIDCheck(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	t.Cleanup(func() {
		if _, err := d.Deploy(context.Background(), dep.GPUs); err != nil {
			t.Errorf("restore the uuid deployment: %v", err)
		}
	})
	byIndex, err := d.Deploy(ctx, rig.GPUs{NVML: "sim:a100-80gb*8", Selected: 2, IDStrategy: "index"})
	if err != nil {
		t.Fatal(err)
	}
	before := nriCounter(t, ctx, "nvinject_nri_injections_total")
	createPod(t, ctx, "gpu-by-index", gpuPod)
	waitPod(t, ctx, "gpu-by-index", 2*time.Minute, "Running", running)
	if got := containerGPUs(t, ctx, "gpu-by-index"); !slices.Equal(got, []string{byIndex.UUID}) {
		t.Errorf("pod sees %v, want only GPU 2 %s", got, byIndex.UUID)
	}
	if after := nriCounter(t, ctx, "nvinject_nri_injections_total"); after != before+1 {
		t.Errorf("nvinject-nri injections %v -> %v, want one more", before, after)
	}
}

// (i) containerd restarts: nvinject-nri reconnects and checks the next GPU pod.
func TestContainerdRestartNRIReconnects(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	if err := d.Node().Restart(ctx, "containerd"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	err := rig.Poll(ctx, 500*time.Millisecond, func(ctx context.Context) error {
		m, err := d.Metrics(ctx, rig.NRIPlugin)
		if err != nil {
			return err
		}
		if !regexp.MustCompile(`(?m)^nvinject_nri_connected 1$`).MatchString(m) {
			return errString("nvinject-nri not connected yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nvinject-nri connected again %s after containerd was up", time.Since(t0).Round(time.Millisecond))
	injected := nriCounter(t, ctx, "nvinject_nri_injections_total")
	createPod(t, ctx, "gpu-after-containerd", gpuPod)
	waitPod(t, ctx, "gpu-after-containerd", 2*time.Minute, "Running", running)
	if got := nriCounter(t, ctx, "nvinject_nri_injections_total"); got <= injected {
		t.Errorf("nvinject-nri injections %v -> %v: the GPU pod after the restart was not checked", injected, got)
	}
	if got := containerGPUs(t, ctx, "gpu-after-containerd"); !slices.Equal(got, []string{dep.UUID}) {
		t.Errorf("pod sees %v, want %s", got, dep.UUID)
	}
}

// (h) With nvinject-nri gone, containerd refuses a GPU pod that names it in
// required-plugins (fail closed), instead of starting it unchecked.
func TestNRIDownFailsClosed(t *testing.T) {
	ctx := testCtx(t)
	stopNRI(t, ctx)
	createPod(t, ctx, "gpu-nri-down", gpuPod)
	checkRequiredPluginRefusal(t, ctx, "gpu-nri-down")
}

// stopNRI takes nvinject-nri off the node until t ends: its DaemonSet
// selects a label the node lacks.
func stopNRI(t *testing.T, ctx context.Context) {
	t.Helper()
	d := need(t)
	k := d.Kube()
	if _, err := k.Kubectl(ctx, "", "-n", rig.Namespace, "patch", "daemonset", rig.NRIPlugin, "--type=merge",
		"-p", `{"spec":{"template":{"spec":{"nodeSelector":{"nvinject.io/e2e-nri-off":"true"}}}}}`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := k.Kubectl(ctx, "", "-n", rig.Namespace, "patch", "daemonset", rig.NRIPlugin, "--type=json",
			"-p", `[{"op":"remove","path":"/spec/template/spec/nodeSelector/nvinject.io~1e2e-nri-off"}]`); err != nil {
			t.Errorf("restore nvinject-nri: %v", err)
		}
		if err := d.WaitReady(ctx, dep, 2*time.Minute); err != nil {
			t.Errorf("restore nvinject-nri: %v", err)
		}
	})
	if err := d.WaitPodsGone(ctx, rig.Namespace, "app.kubernetes.io/name="+rig.NRIPlugin); err != nil {
		t.Fatal(err)
	}
}

// checkRequiredPluginRefusal: pod name fails with containerd's refusal
// for a required plugin that is not connected.
func checkRequiredPluginRefusal(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	p := waitPod(t, ctx, name, 2*time.Minute, "CreateContainerError", createError)
	_, msg := waitingReason(p)
	if !strings.Contains(msg, "nvinject") || !strings.Contains(strings.ToLower(msg), "required") {
		t.Errorf("CreateContainerError message = %q, want containerd's required-plugin refusal naming nvinject", msg)
	}
}

// (g) A pod without a GPU request that names a GPU in a spoofed
// cdi.k8s.io pod annotation is refused by nvinject-nri.
func TestSpoofedCDIAnnotationRefused(t *testing.T) {
	ctx := testCtx(t)
	createPod(t, ctx, "gpu-spoof", podSpec{runtimeClass: true, annotations: map[string]string{
		"cdi.k8s.io/nvinject.gpu_spoof": "nvidia.com/gpu=" + dep.UUID}})
	p := waitPod(t, ctx, "gpu-spoof", 2*time.Minute, "CreateContainerError", createError)
	_, msg := waitingReason(p)
	if !strings.Contains(msg, "pod-level annotations name GPUs") || !strings.Contains(msg, dep.UUID) {
		t.Errorf("CreateContainerError message = %q, want nvinject's pod-level annotation refusal naming %s", msg, dep.UUID)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func registrations(t *testing.T, ctx context.Context) int {
	t.Helper()
	m, err := need(t).Metrics(ctx, rig.DevicePlugin)
	if err != nil {
		t.Fatal(err)
	}
	v := metricValue(m, `nvinject_device_plugin_registrations_total{result="ok"}`)
	return int(v)
}

func nriCounter(t *testing.T, ctx context.Context, name string) float64 {
	t.Helper()
	m, err := need(t).Metrics(ctx, rig.NRIPlugin)
	if err != nil {
		t.Fatal(err)
	}
	return metricValue(m, name)
}

// metricValue sums the samples of series (a name, or a name with labels) in Prometheus text.
func metricValue(text, series string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, series) {
			continue
		}
		rest := strings.TrimPrefix(line, series)
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// runVLLMOnSelectedGPU starts the vLLM stand-in (removed when t ends) and
// asserts that nvidia-smi in it sees exactly the selected GPU.
func runVLLMOnSelectedGPU(t *testing.T, ctx context.Context, d *rig.Deployer) *corev1.Pod {
	t.Helper()
	pod, err := d.RunVLLM(ctx, 2*time.Minute)
	t.Cleanup(func() {
		if err := d.DeleteVLLM(context.Background()); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := containerGPUs(t, ctx, pod.Name); !slices.Equal(got, []string{dep.UUID}) {
		t.Errorf("nvidia-smi in %s sees %v, want exactly the selected %s", pod.Name, got, dep.UUID)
	}
	return pod
}
