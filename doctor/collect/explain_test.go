package collect

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

var explainNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// TestPod reads a DRA pod, its claim, its audit Events (not
// another pod's, not an earlier pod's of the same name, not kubelet's) and
// nvinject-nri's audit metrics.
func TestPod(t *testing.T) {
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(contract.MetricNRIAuditEnabled + " 1\n" + contract.MetricNRIAuditEvents + `{outcome="sent"} 2` + "\n" +
			contract.MetricNRIAuditEvents + `{outcome="rate-limited"} 1` + "\n"))
	}))
	defer metrics.Close()
	claim := "vllm-gpu-x"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vllm", UID: "uid-1", CreationTimestamp: metav1.NewTime(explainNow.Add(-time.Minute))},
		Spec: corev1.PodSpec{NodeName: "worker", Containers: []corev1.Container{{Name: "vllm", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{contract.ResourceName: resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Name: "vllm", Ready: true, ContainerID: "containerd://1", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}},
			ExtendedResourceClaimStatus: &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: claim,
				RequestMappings: []corev1.ContainerExtendedResourceRequest{{ContainerName: "vllm", ResourceName: contract.ResourceName, RequestName: "container-0-request-0"}}}},
	}
	rc := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: claim},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "container-0-request-0", Driver: contract.DRADriver, Pool: "worker", Device: "gpu-0"}}}}}}
	note := contract.AuditNote{Container: "vllm", Assigned: "DRA [default/vllm-gpu-x:worker/gpu-0]", CDI: "[x]", Checked: "y", Verdict: "admitted [" + uuid + "]"}.String()
	event := func(name, pod, uid, component, reason, msg string) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod, UID: types.UID("uid-" + uid)},
			Source:         corev1.EventSource{Component: component, Host: "worker"}, Reason: reason, Message: msg, Count: 1,
			LastTimestamp: metav1.NewTime(explainNow)}
	}
	nri := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: contract.Namespace, Name: "nvinject-nri-x", Labels: map[string]string{contract.AppLabel: contract.NRIApp}},
		Spec: corev1.PodSpec{NodeName: "worker"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	cs := fake.NewClientset(pod, rc, nri,
		event("a", "vllm", "1", contract.EventSource, contract.EventReasonGPUAdmitted, note),
		event("b", "vllm", "0", contract.EventSource, contract.EventReasonGPURefused, note), // an earlier pod named vllm
		event("c", "other", "2", contract.EventSource, contract.EventReasonGPUAdmitted, note),
		event("d", "vllm", "1", "kubelet", "Started", "Started container vllm"),
		event("e", "vllm", "1", contract.EventSource, contract.EventReasonGPURefused, "not a note"))
	e := Pod(context.Background(), Options{Client: cs, NRIMetrics: metrics.URL, Now: func() time.Time { return explainNow }}, "vllm")
	if e.Unread != "" || e.RecordsUnread != "" || e.ClaimsUnread != "" || e.NRI.MetricsUnread != "" {
		t.Fatalf("unread: %q %q %q %q", e.Unread, e.RecordsUnread, e.ClaimsUnread, e.NRI.MetricsUnread)
	}
	parsed, unparsed := 0, 0
	for _, r := range e.Records {
		switch {
		case r.Unparsed != "":
			unparsed++
			if r.Reason != contract.EventReasonGPURefused || r.Unparsed != `"not a note"` {
				t.Errorf("unparsable record %+v, want GPURefused quoting \"not a note\"", r)
			}
		case r.Note.Container == "vllm" && r.Admitted():
			parsed++
		}
	}
	if len(e.Records) != 2 || parsed != 1 || unparsed != 1 {
		t.Errorf("records %+v, want this pod's admission and its unparsable Event", e.Records)
	}
	wantClaim := evidence.Claim{Namespace: "default", Name: claim, Allocated: true,
		Devices: []evidence.ClaimDevice{{Request: "container-0-request-0", Driver: contract.DRADriver, Pool: "worker", Device: "gpu-0"}}}
	if len(e.Claims) != 1 || !reflect.DeepEqual(e.Claims[0], wantClaim) {
		t.Errorf("claims %+v, want %+v", e.Claims, wantClaim)
	}
	c := e.Containers[0]
	if c.GPUs != 1 || !c.Started || c.State != "running" || len(c.Claims) != 1 || c.Claims[0] != (evidence.ClaimRef{Claim: claim, Request: "container-0-request-0"}) {
		t.Errorf("container %+v", c)
	}
	if e.NRI.Pod.Pod != "nvinject-nri-x" || e.NRI.AuditEnabled == nil || *e.NRI.AuditEnabled != 1 || e.NRI.AuditOutcomes[contract.AuditRateLimited] != 1 {
		t.Errorf("nvinject-nri %+v", e.NRI)
	}
	if a := Pod(context.Background(), Options{Client: cs}, "absent"); !strings.Contains(a.Unread, "get pod default/absent") {
		t.Errorf("absent pod: unread %q", a.Unread)
	}
}
