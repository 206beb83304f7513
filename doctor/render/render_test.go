package render

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/doctor/check"
)

func TestWriteTable(t *testing.T) {
	var many []string
	for i := range 10 {
		many = append(many, fmt.Sprintf("fact %d", i))
	}
	r := check.Report{Node: "worker", Time: time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC), Verdicts: []check.Verdict{
		{Layer: check.LayerDriver, Status: check.OK, Evidence: []string{"nvidia-smi: GPU 0"}},
		{Layer: check.LayerRegistration, Status: check.OK, Evidence: []string{"capacity 1"}},
		{Layer: check.LayerHealth, Status: check.Broken, Evidence: []string{"device GPU-1 is Unhealthy\n  (xid 79)"},
			Fix: "the plugin reports the GPU Unhealthy"},
		{Layer: check.LayerScheduling, Status: check.Unknown, Evidence: many, Fix: "give the doctor the cluster"},
		{Layer: check.LayerApplication, Status: check.OK},
	}}
	var b bytes.Buffer
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	// Evidence is one line each, at most maxEvidence of them a layer.
	want := `nvinject-doctor: node worker at 2026-11-30T08:00:00Z
LAYER         VERDICT  EVIDENCE / FIX
driver        OK       nvidia-smi: GPU 0
registration  OK       capacity 1
health        BROKEN   device GPU-1 is Unhealthy (xid 79)
                       fix: the plugin reports the GPU Unhealthy
scheduling    UNKNOWN  fact 0
                       fact 1
                       fact 2
                       fact 3
                       fact 4
                       fact 5
                       fact 6
                       fact 7
                       (2 more in --json)
                       fix: give the doctor the cluster
application   OK       -
broken: [health] (start with the first: later layers depend on it)
`
	if got := b.String(); got != want {
		t.Errorf("table\n%s\nwant\n%s", got, want)
	}
}

// TestJSONFieldNames pins the machine-readable field names.
func TestJSONFieldNames(t *testing.T) {
	var b bytes.Buffer
	r := check.Report{Node: "n", Verdicts: []check.Verdict{{Layer: check.LayerDriver, Symptom: "s", Status: check.Broken, Evidence: []string{"e"}, Fix: "f"}}}
	if err := WriteJSON(&b, r); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	v := m["verdicts"].([]any)[0].(map[string]any)
	for _, k := range []string{"layer", "symptom", "status", "evidence", "fix"} {
		if _, ok := v[k]; !ok {
			t.Errorf("verdict JSON lacks %q: %v", k, v)
		}
	}
	for _, k := range []string{"node", "time", "verdicts", "evidence"} {
		if _, ok := m[k]; !ok {
			t.Errorf("report JSON lacks %q", k)
		}
	}
}

// TestWriteExplanation: one block per container, its steps in order, the
// reason for a missing record just before "now", earlier verdicts last.
func TestWriteExplanation(t *testing.T) {
	x := check.Explanation{Pod: "default/vllm", Facts: []string{"uid u on worker"}, Containers: []check.ContainerChain{
		{Name: "vllm", Steps: []check.ChainStep{{Label: check.StepRequested, Text: "nvidia.com/gpu: 1"}, {Label: check.StepVerdict, Text: "ADMITTED [GPU-1]"}, {Label: check.StepNow, Text: "running, ready=true"}},
			History: []string{"2026-12-01T11:50:00Z GPURefused ×3: refused gpu-held"}},
		{Name: "sidecar", Steps: []check.ChainStep{{Label: check.StepRequested, Text: "no GPU"}, {Label: check.StepNow, Text: "running"}},
			NoRecord: "the container has no GPU"},
	}}
	var b bytes.Buffer
	if err := WriteExplanation(&b, x); err != nil {
		t.Fatal(err)
	}
	want := `pod default/vllm
  uid u on worker

container vllm
  requested  nvidia.com/gpu: 1
  verdict    ADMITTED [GPU-1]
  now        running, ready=true
  earlier    2026-12-01T11:50:00Z GPURefused ×3: refused gpu-held

container sidecar
  requested  no GPU
  no record  the container has no GPU
  now        running
`
	if got := b.String(); got != want {
		t.Errorf("rendered\n%s\nwant\n%s", got, want)
	}
}

// TestExplainInReadme: README.md's "What each layer checks" block is the
// binary's --explain output, so a new or renamed layer updates both.
func TestExplainInReadme(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "## What each layer checks (`nvinject-doctor --explain`)\n\n```text\n")
	block, _, fenced := strings.Cut(block, "```")
	if !ok || !fenced {
		t.Fatal("README.md has no --explain block")
	}
	var b bytes.Buffer
	if err := WriteExplain(&b); err != nil {
		t.Fatal(err)
	}
	if block != b.String() {
		t.Errorf("README.md's --explain block differs from WriteExplain; paste the output of nvinject-doctor --explain:\n%s", b.String())
	}
}
