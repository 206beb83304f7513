package scenarios

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/doctor"
	"github.com/nvinject/nvinject/e2e/harness/rig"
)

// runDoctor runs the doctor in-process against the shared node, as an
// operator would on the worker.
func runDoctor(t *testing.T, ctx context.Context, mod func(*doctor.Options)) doctor.Report {
	t.Helper()
	d := need(t)
	o := doctor.Options{
		Client: d.Kube().Client, Node: d.Node().Name(),
		CDISpecDirs: d.CDISpecDirs(), ContainerdConfig: d.Node().ContainerdConfig(),
		NvidiaSMI: strings.Join(d.HostSMICommand(), " "),
	}
	if mod != nil {
		mod(&o)
	}
	r, err := doctor.Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wantBroken asserts that layer is the first broken one and that its evidence
// and fix contain the given texts.
func wantBroken(t *testing.T, r doctor.Report, layer doctor.Layer, evidence, fix string) {
	t.Helper()
	v, _ := r.Verdict(layer)
	if b := r.Broken(); len(b) == 0 || b[0] != layer {
		t.Errorf("doctor: first broken layer %v, want %s; verdict %+v", b, layer, v)
	}
	if ev := strings.Join(v.Evidence, "\n"); v.Status != doctor.Broken || !strings.Contains(ev, evidence) || !strings.Contains(v.Fix, fix) {
		t.Errorf("doctor %s: status %s, evidence %q (want %q), fix %q (want %q)", layer, v.Status, ev, evidence, v.Fix, fix)
	}
}

// waitDoctor re-runs the doctor until layer is broken (the fault takes a
// moment to reach every input), then returns that report.
func waitDoctor(t *testing.T, ctx context.Context, layer doctor.Layer, mod func(*doctor.Options)) doctor.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var r doctor.Report
	err := rig.Poll(ctx, time.Second, func(ctx context.Context) error {
		r = runDoctor(t, ctx, mod)
		if v, _ := r.Verdict(layer); v.Status != doctor.Broken {
			return errString("doctor: " + string(layer) + " is " + string(v.Status))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v; report %+v", err, r.Verdicts)
	}
	return r
}

func TestDoctorHealthyNode(t *testing.T) {
	ctx := testCtx(t)
	r := runDoctor(t, ctx, nil)
	for _, l := range []doctor.Layer{doctor.LayerDriver, doctor.LayerRegistration, doctor.LayerHealth, doctor.LayerScheduling, doctor.LayerAllocate, doctor.LayerInjection, doctor.LayerCDIRuntime} {
		if v, _ := r.Verdict(l); v.Status != doctor.OK {
			t.Errorf("doctor on the healthy node: %s is %s: %v %s", l, v.Status, v.Evidence, v.Fix)
		}
	}
}

// Device plugin DaemonSet removed: the plugin is not registered.
func TestDoctorPluginNotRegistered(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	if _, err := d.Kube().Kubectl(ctx, "", "-n", rig.Namespace, "delete", "daemonset", rig.DevicePlugin, "--wait=true"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { restoreDeployment(t) })
	if err := d.WaitPodsGone(ctx, rig.Namespace, "app.kubernetes.io/name="+rig.DevicePlugin); err != nil {
		t.Fatal(err)
	}
	r := waitDoctor(t, ctx, doctor.LayerRegistration, nil)
	wantBroken(t, r, doctor.LayerRegistration, "no single-gpu-device-plugin pod", "DaemonSet")
}

// Xid 79 on the selected GPU: the device is unhealthy.
func TestDoctorUnhealthyDevice(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	if err := d.SimDebug(ctx, "xid", "uuid="+dep.UUID+"&xid=79"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.SimDebug(context.Background(), "recover", "uuid="+dep.UUID); err != nil {
			t.Error(err)
		}
		waitAllocatable(t, context.Background(), 1, 1, 30*time.Second)
	})
	waitAllocatable(t, ctx, 1, 0, 30*time.Second)
	r := waitDoctor(t, ctx, doctor.LayerHealth, nil)
	wantBroken(t, r, doctor.LayerHealth, "xid 79", "/debug/sim/recover")
}

// The GPU is held by one pod; a second GPU pod is Pending.
func TestDoctorGPUTaken(t *testing.T) {
	ctx := testCtx(t)
	createPod(t, ctx, "doc-holder", gpuPod)
	waitPod(t, ctx, "doc-holder", 2*time.Minute, "Running", running)
	createPod(t, ctx, "doc-pending", gpuPod)
	waitEvent(t, ctx, "doc-pending", "FailedScheduling", "Insufficient nvidia.com/gpu")
	r := waitDoctor(t, ctx, doctor.LayerScheduling, nil)
	wantBroken(t, r, doctor.LayerScheduling, "Insufficient nvidia.com/gpu", "doc-holder")
}

// The CDI spec the device plugin wrote is gone: its names do not resolve.
func TestDoctorUnresolvableCDIName(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	spec := filepath.Join(d.Node().CDIDir(), "nvidia.com-gpu.yaml")
	content, err := os.ReadFile(spec)
	if err != nil {
		t.Fatalf("read the device plugin's CDI spec: %v", err)
	}
	if err := os.Remove(spec); err != nil {
		t.Fatalf("remove the CDI spec: %v", err)
	}
	t.Cleanup(func() {
		// Written in place: containerd's CDI cache missed a spec renamed back
		// into the dir (observed with containerd 2.2.9) but sees a write.
		if err := os.WriteFile(spec, content, 0o600); err != nil {
			t.Errorf("restore the CDI spec: %v", err)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		createPod(t, ctx, "doc-cdi-back", gpuPod)
		waitPod(t, ctx, "doc-cdi-back", time.Minute, "Running (the restored spec resolves)", running)
		deletePod(t, "doc-cdi-back")
	})
	createPod(t, ctx, "doc-nocdi", gpuPod)
	p := waitPod(t, ctx, "doc-nocdi", 2*time.Minute, "CreateContainerError", createError)
	t.Logf("pod: %s", describe(p))
	r := waitDoctor(t, ctx, doctor.LayerCDIRuntime, nil)
	wantBroken(t, r, doctor.LayerCDIRuntime, "nvidia.com/gpu="+dep.UUID, "CDI spec for that GPU is missing or stale")
}

// A RuntimeClass whose handler containerd does not have.
func TestDoctorMissingRuntimeHandler(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	const name = "nvidia-e2e-missing"
	rcs := d.Kube().Client.NodeV1().RuntimeClasses()
	if _, err := rcs.Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: name}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rcs.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})
	r := waitDoctor(t, ctx, doctor.LayerCDIRuntime, func(o *doctor.Options) { o.RuntimeClass = name })
	wantBroken(t, r, doctor.LayerCDIRuntime, `defines no runtime handler "`+name+`"`, "install-containerd-config")
}

// nvinject-nri refuses a GPU pod without runtimeClassName: nvidia (scenario f).
func TestDoctorNRIRefusal(t *testing.T) {
	ctx := testCtx(t)
	createPod(t, ctx, "doc-no-rc", podSpec{gpu: true})
	waitPod(t, ctx, "doc-no-rc", 2*time.Minute, "CreateContainerError", createError)
	r := waitDoctor(t, ctx, doctor.LayerCDIRuntime, nil)
	wantBroken(t, r, doctor.LayerCDIRuntime, "nvinject-nri refused default/doc-no-rc", "runtimeClassName")
}

// restoreDeployment re-applies the deployment the suite started with.
func restoreDeployment(t *testing.T) {
	t.Helper()
	if _, err := need(t).Deploy(context.Background(), dep.GPUs); err != nil {
		t.Errorf("restore nvinject: %v", err)
	}
}

// A spec an earlier install left in /var/run/cdi (the dir containerd reads after the
// daemon's) defines the daemon's GPU again and wins: GPU pods would get what that file
// says. The doctor names the device, the file that wins and the fix.
func TestDoctorShadowingSpec(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	own := filepath.Join(d.Node().CDIDir(), "nvidia.com-gpu.yaml")
	content, err := os.ReadFile(own)
	if err != nil {
		t.Fatalf("read the device plugin's CDI spec: %v", err)
	}
	const leftover = "/var/run/cdi/nvidia.yaml"
	if _, err := os.Stat(leftover); err == nil {
		t.Skipf("%s exists on this machine: not ours to replace", leftover)
	}
	if err := os.MkdirAll(filepath.Dir(leftover), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(leftover, content, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(leftover); err != nil {
			t.Errorf("remove %s: %v", leftover, err)
		}
	})
	r := runDoctor(t, ctx, nil)
	v, _ := r.Verdict(doctor.LayerCDIRuntime)
	ev := strings.Join(v.Evidence, "\n")
	if v.Status != doctor.Broken || !strings.Contains(ev, "nvidia.com/gpu="+dep.UUID) || !strings.Contains(ev, "containerd takes "+leftover) || !strings.Contains(v.Fix, "rm "+leftover) {
		t.Errorf("doctor cdi-runtime with a shadowing %s: status %s\nevidence:\n%s\nfix: %s", leftover, v.Status, ev, v.Fix)
	}
}
