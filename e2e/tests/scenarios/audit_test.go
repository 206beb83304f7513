package scenarios

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

// TestAuditTrail: nvinject-nri records its verdict on each GPU container as
// an Event on the pod, and `nvinject-doctor explain` prints the chain from
// it: for a running GPU pod (admitted) and for a pod refused for a spoofed
// CDI annotation.
func TestAuditTrail(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	createPod(t, ctx, "audit-gpu", gpuPod)
	createPod(t, ctx, "audit-spoof", podSpec{runtimeClass: true, annotations: map[string]string{
		"cdi.k8s.io/nvinject.gpu_spoof": "nvidia.com/gpu=" + dep.UUID}})
	gpu := waitPod(t, ctx, "audit-gpu", 2*time.Minute, "Running", running)
	spoof := waitPod(t, ctx, "audit-spoof", 2*time.Minute, "CreateContainerError", createError)

	for _, tc := range []struct {
		pod    *corev1.Pod
		reason string
		want   contract.AuditNote
	}{
		{gpu, contract.EventReasonGPUAdmitted, contract.AuditNote{Container: "main", Assigned: contract.ResourceName + " [" + dep.UUID + "]",
			CDI: "[nvidia.com/gpu=" + dep.UUID + "]", Verdict: "admitted [" + dep.UUID + "]"}},
		{spoof, contract.EventReasonGPURefused, contract.AuditNote{Container: "main", Assigned: "not asked (the verdict came before kubelet was asked)",
			CDI: "none", Checked: "not reached", Verdict: "refused pod-annotation: nvinject: container main of pod default/audit-spoof: pod-level annotations name GPUs"}},
	} {
		ev := auditEvent(t, ctx, tc.pod, tc.reason)
		n, err := contract.ParseAuditNote(ev.Message)
		if err != nil {
			t.Fatalf("%s's %s Event: %v", tc.pod.Name, tc.reason, err)
		}
		t.Logf("%s: %s %s ×%d from %s on %s: %s", tc.pod.Name, ev.Type, ev.Reason, ev.Count, ev.Source.Component, ev.Source.Host, ev.Message)
		if n.Container != tc.want.Container || n.Assigned != tc.want.Assigned || n.CDI != tc.want.CDI || !strings.HasPrefix(n.Verdict, tc.want.Verdict) ||
			(tc.want.Checked != "" && n.Checked != tc.want.Checked) || ev.Source.Host != d.Node().Name() {
			t.Errorf("%s's note %+v from %s, want %+v from %s", tc.pod.Name, n, ev.Source.Host, tc.want, d.Node().Name())
		}
		if tc.pod == gpu && (!strings.Contains(n.Checked, "/dev/nvidia0 195:0") || !strings.Contains(n.Checked, contract.EnvUUIDPrefix+"0="+dep.UUID) || !strings.Contains(n.Checked, "driver mounts")) {
			t.Errorf("the admitted container's checked edits %q lack its GPU node, UUID variable or driver mounts", n.Checked)
		}
	}
	// The verdict's one log line carries the same record.
	nri, err := d.DaemonSetPod(ctx, rig.NRIPlugin)
	if err != nil {
		t.Fatal(err)
	}
	logs, err := d.Kube().Client.CoreV1().Pods(nri.Namespace).GetLogs(nri.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(logs), "\n") {
		if strings.Contains(l, `"pod":"default/audit-gpu"`) && strings.Contains(l, `"msg":"injected GPUs"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.Contains(lines[0], `"assigned":"nvidia.com/gpu [`+dep.UUID+`]"`) || !strings.Contains(lines[0], `"checked_env":["`+contract.EnvUUIDPrefix+"0=") {
		t.Errorf("nvinject-nri's verdict lines for audit-gpu: %q, want one carrying the record", lines)
	} else {
		t.Logf("nvinject-nri: %s", lines[0])
	}
	if sent := nriCounter(t, ctx, contract.MetricNRIAuditEvents+`{outcome="sent"}`); sent < 2 {
		t.Errorf("%s sent = %v, want at least the two Events", contract.MetricNRIAuditEvents, sent)
	}

	for _, tc := range []struct {
		pod  string
		want []string
	}{
		{"audit-gpu", []string{"requested         nvidia.com/gpu: 1", "kubelet assigned  nvidia.com/gpu [" + dep.UUID + "]",
			"CDI names         [nvidia.com/gpu=" + dep.UUID + "]", "checked           devices [/dev/nvidia0 195:0",
			"verdict           ADMITTED [" + dep.UUID + "] (GPUAdmitted", "now               running, ready=true", "audit Events on"}},
		{"audit-spoof", []string{"requested         no GPU", "kubelet assigned  not asked", "CDI names         none",
			"verdict           REFUSED pod-annotation: nvinject: container main of pod default/audit-spoof: pod-level annotations name GPUs",
			"now               waiting CreateContainerError"}},
	} {
		out, err := exec.CommandContext(ctx, d.Bin("nvinject-doctor"), "explain", "--kubeconfig", d.Kube().Kubeconfig, "--pod-namespace", ns, tc.pod).CombinedOutput()
		t.Logf("$ nvinject-doctor explain --pod-namespace %s %s\n%s", ns, tc.pod, out)
		if err != nil {
			t.Fatalf("nvinject-doctor explain %s: %v", tc.pod, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("explain %s lacks %q", tc.pod, w)
			}
		}
	}
}

// auditEvent waits for nvinject-nri's Event with reason on pod (this pod,
// by UID).
func auditEvent(t *testing.T, ctx context.Context, pod *corev1.Pod, reason string) corev1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var found corev1.Event
	err := rig.Poll(ctx, 300*time.Millisecond, func(ctx context.Context) error {
		evs, err := need(t).Kube().Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": pod.Name, "reason": reason}.String()})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.UID == pod.UID && e.Source.Component == contract.EventSource {
				found = e
				return nil
			}
		}
		return errString("no " + reason + " Event from " + contract.EventSource + " on " + pod.Name)
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}
