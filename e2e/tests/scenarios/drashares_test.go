package scenarios

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/gpunode/mps"
	"github.com/nvinject/nvinject/shared/contract"
)

// enableDRAShares patches nvinject-dra's DaemonSet with the shipped
// deploy/components/dra-gpu-shares and waits until the node's slices show
// the GPU's share device; the returned func puts the container back and
// waits until they no longer do.
func enableDRAShares(t *testing.T, ctx context.Context) (restore func()) {
	t.Helper()
	undo, err := need(t).ApplyDRAComponent(ctx, "dra-gpu-shares")
	if err != nil {
		t.Fatal(err)
	}
	share := contract.DRAShareDeviceName(0)
	if err := need(t).WaitSliceDevice(ctx, share, true); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := errors.Join(undo(context.Background()), need(t).WaitSliceDevice(context.Background(), share, false)); err != nil {
			t.Fatal(err)
		}
	}
}

// createShareClaim creates a ResourceClaim for a share of a GPU with
// memory and, when set, computePercent, deleted when t ends.
func createShareClaim(t *testing.T, ctx context.Context, name, memory, percent string) *resourceapi.ResourceClaim {
	t.Helper()
	req := map[resourceapi.QualifiedName]resource.Quantity{contract.DRACapacityMemory: resource.MustParse(memory)}
	if percent != "" {
		req[contract.DRACapacityComputePercent] = resource.MustParse(percent)
	}
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "share",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: contract.DRAShareClass, Capacity: &resourceapi.CapacityRequirements{Requests: req}}}}}}}
	got, err := need(t).Kube().Client.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = need(t).Kube().Client.ResourceV1().ResourceClaims(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return got
}

// testDRAShares: two pods of 40Gi and 30Gi shares run on the one 80 GB GPU,
// each the client of its own share's MPS daemon (NVIDIA's real control
// program answers each share's limits inside the pod); a third share of
// 30Gi, 20Gi more than is left, stays Pending with the scheduler's reason.
func testDRAShares(t *testing.T, ctx context.Context) {
	if !driver.Real() {
		t.Skip("shares are enforced by NVIDIA's real MPS control daemon: " + driver.String())
	}
	d := need(t)
	t.Cleanup(enableDRAShares(t, ctx))
	for _, s := range []struct{ pod, claim, memory, percent, wantPct, wantMem string }{
		{"dra-share-40", "share-40gi", "40Gi", "50", "50.0", "40G"},
		{"dra-share-30", "share-30gi", "30Gi", "", "10.0", "30G"},
	} {
		c := createShareClaim(t, ctx, s.claim, s.memory, s.percent)
		createClaimPod(t, ctx, s.pod, c.Name, rig.VLLMImage)
		waitPod(t, ctx, s.pod, 2*time.Minute, "Running", running)
		if got := containerGPUs(t, ctx, s.pod); !slices.Equal(got, []string{dep.UUID}) {
			t.Errorf("pod %s sees %v, want exactly %s", s.pod, got, dep.UUID)
		}
		out, err := d.Kube().Exec(ctx, ns, s.pod, "", "/bin/sh", "-c",
			`env | grep '^CUDA_MPS_' | sort; echo get_default_active_thread_percentage | nvidia-cuda-mps-control; echo get_default_device_pinned_mem_limit 0 | nvidia-cuda-mps-control`)
		if err != nil {
			t.Fatalf("MPS client in %s: %v\n%s", s.pod, err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if pipe := "CUDA_MPS_PIPE_DIRECTORY=" + mps.PathsOf(d.MPSDir(), string(c.UID)).Pipe; !slices.Contains(lines, pipe) {
			t.Errorf("pod %s lacks its share's daemon %s:\n%s", s.pod, pipe, out)
		}
		if len(lines) < 2 || lines[len(lines)-2] != s.wantPct || lines[len(lines)-1] != s.wantMem {
			t.Errorf("pod %s: its share's MPS daemon answered %q, want %s and %s", s.pod, lines, s.wantPct, s.wantMem)
		}
		t.Logf("FIGURE DRA share: pod %s on %s, claim %s (%s): its daemon answers %s threads, %s pinned", s.pod, dep.UUID, s.claim, s.memory, s.wantPct, s.wantMem)
	}
	third := createShareClaim(t, ctx, "share-30gi-more", "30Gi", "")
	createClaimPod(t, ctx, "dra-share-over", third.Name, rig.BusyboxImage)
	msg := waitEvent(t, ctx, "dra-share-over", "FailedScheduling", "cannot allocate all claims")
	waitPod(t, ctx, "dra-share-over", 5*time.Second, "Pending and unbound", func(p *corev1.Pod) bool { return p.Status.Phase == "Pending" && p.Spec.NodeName == "" })
	t.Logf("FIGURE DRA share: a 30Gi share with 10Gi left Pending: %s", msg)
	for _, n := range []string{"dra-share-over", "dra-share-40", "dra-share-30"} {
		deletePod(t, n)
	}
}

// adminLabel is the namespace label the API server requires of claims
// with admin access (KEP-5018).
const adminLabel = "resource.kubernetes.io/admin-access"

// testDRAAdminAccess: a claim with admin access is refused by the API
// server in a namespace without the label; with it, a monitor pod runs
// beside the pod holding the GPU, on the same GPU, and nvinject-nri's
// audit Event says so; a second pod without admin access stays Pending.
func testDRAAdminAccess(t *testing.T, ctx context.Context) {
	d := need(t)
	claims := d.Kube().Client.ResourceV1().ResourceClaims(ns)
	createTemplate(t, ctx)
	createDRAPod(t, ctx, "dra-work", podSpec{runtimeClass: true}, "gpu-80gb")
	waitPod(t, ctx, "dra-work", 2*time.Minute, "Running", running)

	admin := true
	mon := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "gpu-monitor", Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: contract.DRADriver, AdminAccess: &admin}}}}}}
	_, err := claims.Create(ctx, mon, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), adminLabel) {
		t.Fatalf("admin-access claim in namespace %s without label %s: %v, want the API server's refusal", ns, adminLabel, err)
	}
	t.Logf("FIGURE DRA admin access: without the namespace label the API server refuses: %s", err)

	nss := d.Kube().Client.CoreV1().Namespaces()
	label := func(v any) {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{adminLabel: v}}})
		if _, err := nss.Patch(context.Background(), ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	label("true")
	t.Cleanup(func() { label(nil) })
	if _, err := claims.Create(ctx, mon, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = claims.Delete(context.Background(), mon.Name, metav1.DeleteOptions{}) })
	createClaimPod(t, ctx, "dra-monitor", mon.Name, rig.BusyboxImage)
	waitPod(t, ctx, "dra-monitor", 2*time.Minute, "Running", running)
	for _, p := range []string{"dra-work", "dra-monitor"} {
		if got := containerGPUs(t, ctx, p); !slices.Equal(got, []string{dep.UUID}) {
			t.Errorf("pod %s sees %v, want %s", p, got, dep.UUID)
		}
	}
	ev := waitEvent(t, ctx, "dra-monitor", contract.EventReasonGPUAdmitted, "with admin access beside [default/dra-work]")
	t.Logf("FIGURE DRA admin access: monitor Running beside dra-work on %s; nvinject-nri: %s", dep.UUID, ev)

	createDRAPod(t, ctx, "dra-second", podSpec{runtimeClass: true}, "gpu-80gb")
	waitPod(t, ctx, "dra-second", time.Minute, "Unschedulable", unschedulable)
	for _, p := range []string{"dra-second", "dra-monitor", "dra-work"} {
		deletePod(t, p)
	}
}
