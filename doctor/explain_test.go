package doctor

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
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

func float(v float64) *float64 { return &v }

// explainEvidence is a running device-plugin pod with its admission record.
func explainEvidence() evidence.ExplainEvidence {
	return evidence.ExplainEvidence{
		Pod: evidence.PodRef{Namespace: "default", Name: "vllm"}, UID: "uid-1", Node: "worker", Phase: "Running", RuntimeClass: "nvidia",
		Created: explainNow.Add(-5 * time.Minute), Resource: contract.ResourceName, Now: explainNow,
		Containers: []evidence.ExplainContainer{{Name: "vllm", GPUs: 1, State: "running", Ready: true, Started: true}},
		Records: []evidence.AuditRecord{{Reason: contract.EventReasonGPUAdmitted, Count: 1, Last: explainNow.Add(-4 * time.Minute), Host: "worker",
			Note: contract.AuditNote{Container: "vllm", Assigned: "nvidia.com/gpu [" + uuid + "]", CDI: "[nvidia.com/gpu=" + uuid + "]",
				Checked: "devices [/dev/nvidia0 195:0] env [NVINJECT_GPU_UUID_0=" + uuid + "] driver mounts 19/19", Verdict: "admitted [" + uuid + "]"}}},
		NRI: evidence.ExplainNRI{Pod: evidence.DaemonEvidence{App: contract.NRIApp, Namespace: contract.Namespace, Pod: "nvinject-nri-x", Phase: "Running", Ready: true},
			AuditEnabled: float(1), AuditOutcomes: map[string]float64{contract.AuditSent: 3}},
	}
}

func step(c ContainerChain, label string) string {
	for _, s := range c.Steps {
		if s.Label == label {
			return s.Text
		}
	}
	return "<no " + label + ">"
}

func TestExplainChain(t *testing.T) {
	refused := explainEvidence()
	refused.Pod.Name, refused.Phase = "gpu-spoof", "Pending"
	refused.Containers = []evidence.ExplainContainer{{Name: "main", State: "waiting", Reason: "CreateContainerError", Message: "nvinject: container main of pod default/gpu-spoof: pod-level annotations name GPUs"}}
	refused.Records = []evidence.AuditRecord{{Reason: contract.EventReasonGPURefused, Count: 4, Last: explainNow, Host: "worker",
		Note: contract.AuditNote{Container: "main", Assigned: "not asked (the verdict came before kubelet was asked)", CDI: "none", Checked: "not reached",
			Verdict: "refused pod-annotation: nvinject: container main of pod default/gpu-spoof: pod-level annotations name GPUs"}}}

	dra := explainEvidence()
	dra.Containers[0] = evidence.ExplainContainer{Name: "vllm", GPUs: 1, State: "running", Ready: true, Started: true, Claims: []evidence.ClaimRef{{Claim: "vllm-gpu-abc", Request: "container-0-request-0"}}}
	dra.Claims = []evidence.Claim{{Namespace: "default", Name: "vllm-gpu-abc", Extended: true, Allocated: true, ReservedFor: []string{"default/vllm"},
		Devices: []evidence.ClaimDevice{{Request: "container-0-request-0", Driver: contract.DRADriver, Pool: "worker", Device: "gpu-0"}}}}
	dra.Records[0].Note.Assigned = "DRA [default/vllm-gpu-abc:worker/gpu-0]"

	retried := explainEvidence()
	retried.Records = append([]evidence.AuditRecord{{Reason: contract.EventReasonGPURefused, Count: 3, Last: explainNow.Add(-6 * time.Minute),
		Note: contract.AuditNote{Container: "vllm", Verdict: "refused gpu-held: GPU held by default/old"}}}, retried.Records...)

	tests := []struct {
		name    string
		e       evidence.ExplainEvidence
		steps   map[string]string
		history int
		facts   []string
	}{
		{name: "device plugin, running", e: explainEvidence(), steps: map[string]string{
			StepRequested: "nvidia.com/gpu: 1", StepKubelet: "nvidia.com/gpu [" + uuid + "]", StepCDI: "[nvidia.com/gpu=" + uuid + "]",
			StepChecked: "devices [/dev/nvidia0 195:0] env [NVINJECT_GPU_UUID_0=" + uuid + "] driver mounts 19/19",
			StepVerdict: "ADMITTED [" + uuid + "] (GPUAdmitted ×1, last 2026-12-01T11:56:00Z, nvinject-nri on worker)", StepNow: "running, ready=true"},
			facts: []string{"uid uid-1 on worker: phase Running, RuntimeClass nvidia", "audit Events on, 3 sent"}},
		{name: "refused by a spoofed annotation", e: refused, steps: map[string]string{
			StepRequested: "no GPU (no nvidia.com/gpu, no claim)", StepKubelet: "not asked (the verdict came before kubelet was asked)", StepCDI: "none",
			StepChecked: "not reached", StepVerdict: "REFUSED pod-annotation: nvinject: container main of pod default/gpu-spoof: pod-level annotations name GPUs (GPURefused ×4",
			StepNow: "waiting CreateContainerError: nvinject: container main"}},
		{name: "DRA: the scheduler's claim for nvidia.com/gpu", e: dra, steps: map[string]string{
			StepRequested: "nvidia.com/gpu: 1, claim vllm-gpu-abc request container-0-request-0",
			StepAllocated: "vllm-gpu-abc: request container-0-request-0 → gpu.nvinject.io worker/gpu-0",
			StepKubelet:   "DRA [default/vllm-gpu-abc:worker/gpu-0]"},
			facts: []string{"claim default/vllm-gpu-abc (the scheduler's, for the extended resource): allocated gpu.nvinject.io worker/gpu-0 (request container-0-request-0), reserved for default/vllm"}},
		{name: "refused, then admitted: the latest verdict, the earlier one in the history", e: retried, history: 1,
			steps: map[string]string{StepVerdict: "ADMITTED"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := Explain(tc.e)
			if len(x.Containers) != 1 {
				t.Fatalf("%d container chains", len(x.Containers))
			}
			c := x.Containers[0]
			for label, want := range tc.steps {
				if got := step(c, label); !strings.HasPrefix(got, want) {
					t.Errorf("%s = %q, want %q…", label, got, want)
				}
			}
			if c.NoRecord != "" || len(c.History) != tc.history {
				t.Errorf("no-record %q, history %v; want a record and %d earlier", c.NoRecord, c.History, tc.history)
			}
			facts := strings.Join(x.Facts, "\n")
			for _, f := range tc.facts {
				if !strings.Contains(facts, f) {
					t.Errorf("facts lack %q:\n%s", f, facts)
				}
			}
			var b bytes.Buffer
			if err := WriteExplanation(&b, x); err != nil {
				t.Fatal(err)
			}
			out := b.String()
			t.Logf("\n%s", out)
			if !strings.Contains(out, "container "+c.Name) || !strings.Contains(out, StepVerdict) {
				t.Errorf("rendered:\n%s", out)
			}
		})
	}
}

// TestExplainNoRecord: without an audit Event the chain says why, as
// certainly as the evidence allows.
func TestExplainNoRecord(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*evidence.ExplainEvidence)
		want string
	}{
		{"Events unreadable", func(e *evidence.ExplainEvidence) { e.RecordsUnread = "forbidden" }, "the pod's Events could not be read (forbidden)"},
		{"not scheduled", func(e *evidence.ExplainEvidence) {
			e.Node, e.Unscheduled = "", "0/1 nodes are available: 1 Insufficient nvidia.com/gpu"
			e.Containers[0] = evidence.ExplainContainer{Name: "vllm", GPUs: 1}
		}, "the pod is not scheduled (0/1 nodes are available: 1 Insufficient nvidia.com/gpu)"},
		{"still being created", func(e *evidence.ExplainEvidence) {
			e.Containers[0] = evidence.ExplainContainer{Name: "vllm", GPUs: 1, State: "waiting", Reason: "ContainerCreating"}
		}, "has not reached the runtime's CreateContainer yet (kubelet: ContainerCreating)"},
		{"refused by containerd while nvinject-nri is down", func(e *evidence.ExplainEvidence) {
			e.Containers[0] = evidence.ExplainContainer{Name: "vllm", GPUs: 1, State: "waiting", Reason: "CreateContainerError",
				Message: `failed to create containerd container: required plugin "nvinject" not present`}
		}, "containerd refused the container before nvinject-nri was asked"},
		{"a container without GPUs", func(e *evidence.ExplainEvidence) {
			e.Containers[0] = evidence.ExplainContainer{Name: "sidecar", State: "running", Started: true}
		}, "the container has no GPU"},
		{"nvinject-nri has no API access", func(e *evidence.ExplainEvidence) { e.NRI.AuditEnabled = float(0) }, "has no API access and records no Events"},
		{"nvinject-nri before the audit trail", func(e *evidence.ExplainEvidence) { e.NRI.AuditEnabled = nil }, "it predates the audit trail"},
		{"Events dropped", func(e *evidence.ExplainEvidence) {
			e.NRI.AuditOutcomes = map[string]float64{contract.AuditSent: 1, contract.AuditQueueFull: 2, contract.AuditFailed: 1}
		}, "could not record 3 Events (queue-full 2, failed 1)"},
		{"Events expired", func(e *evidence.ExplainEvidence) { e.Created = explainNow.Add(-3 * time.Hour) }, "Events expire (the API server's --event-ttl, 1h by default) and the pod is 3h0m0s old"},
		{"no nvinject-nri pod", func(e *evidence.ExplainEvidence) { e.NRI.Pod.Pod = "" }, "no nvinject-nri pod runs on worker"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := explainEvidence()
			e.Records = nil
			tc.mod(&e)
			c := Explain(e).Containers[0]
			if !strings.Contains(c.NoRecord, tc.want) {
				t.Errorf("no-record reason %q, want %q", c.NoRecord, tc.want)
			}
			if step(c, StepVerdict) != "<no verdict>" {
				t.Errorf("a verdict without a record: %v", c.Steps)
			}
		})
	}
}

// TestCollectExplain reads a DRA pod, its claim, its audit Events (not
// another pod's, not an earlier pod's of the same name, not kubelet's) and
// nvinject-nri's audit metrics.
func TestCollectExplain(t *testing.T) {
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
	e := CollectExplain(context.Background(), Options{Client: cs, NRIMetrics: metrics.URL, Now: func() time.Time { return explainNow }}, "vllm")
	if e.Unread != "" || e.RecordsUnread != "" || e.ClaimsUnread != "" || e.NRI.MetricsUnread != "" {
		t.Fatalf("unread: %q %q %q %q", e.Unread, e.RecordsUnread, e.ClaimsUnread, e.NRI.MetricsUnread)
	}
	parsed, unparsed := 0, 0
	for _, r := range e.Records {
		switch {
		case r.Unparsed != "":
			unparsed++
		case r.Note.Container == "vllm" && r.Admitted():
			parsed++
		}
	}
	if len(e.Records) != 2 || parsed != 1 || unparsed != 1 {
		t.Errorf("records %+v, want this pod's admission and its unparsable Event", e.Records)
	}
	if len(e.Claims) != 1 || len(e.Claims[0].Devices) != 1 || e.Claims[0].Devices[0].ID() != "worker/gpu-0" {
		t.Errorf("claims %+v", e.Claims)
	}
	c := e.Containers[0]
	if c.GPUs != 1 || !c.Started || c.State != "running" || len(c.Claims) != 1 || c.Claims[0] != (evidence.ClaimRef{Claim: claim, Request: "container-0-request-0"}) {
		t.Errorf("container %+v", c)
	}
	if e.NRI.Pod.Pod != "nvinject-nri-x" || e.NRI.AuditEnabled == nil || *e.NRI.AuditEnabled != 1 || e.NRI.AuditOutcomes[contract.AuditRateLimited] != 1 {
		t.Errorf("nvinject-nri %+v", e.NRI)
	}
	x := Explain(e)
	if got := step(x.Containers[0], StepAllocated); got != "vllm-gpu-x: request container-0-request-0 → gpu.nvinject.io worker/gpu-0" {
		t.Errorf("allocated %q", got)
	}
	if !strings.Contains(strings.Join(x.Facts, "\n"), `audit Event GPURefused is not an audit note: "not a note"`) {
		t.Errorf("facts %v", x.Facts)
	}
	if _, err := RunExplain(context.Background(), Options{Client: cs}, "absent"); err == nil || !strings.Contains(err.Error(), "get pod default/absent") {
		t.Errorf("absent pod: %v", err)
	}
}
