package check

import (
	"strings"
	"testing"
	"time"

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

	unparsed := explainEvidence()
	unparsed.Records = append(unparsed.Records, evidence.AuditRecord{Reason: contract.EventReasonGPURefused, Count: 1, Last: explainNow, Unparsed: `"not a note"`})

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
		{name: "an Event that is not an audit note is a fact, not a verdict", e: unparsed,
			steps: map[string]string{StepVerdict: "ADMITTED [" + uuid + "]"},
			facts: []string{`audit Event GPURefused is not an audit note: "not a note"`}},
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
