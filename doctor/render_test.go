package doctor

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/doctor/evidence"
)

func TestWriteTable(t *testing.T) {
	e := healthy()
	e.NodeStatus.Allocatable = 0
	e.Plugin.Devices[0] = evidence.DeviceHealth{UUID: uuid}
	e.Plugin.HealthEvents = []string{"xid 79"}
	r := Report{Node: e.Node, Time: time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC), Verdicts: Evaluate(e), Evidence: e}
	var b bytes.Buffer
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Logf("\n%s", out)
	for _, want := range []string{
		"LAYER", "driver", "health        BROKEN", "fix: the plugin reports the GPU Unhealthy", "broken: [health]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestJSONFieldNames pins the machine-readable field names.
func TestJSONFieldNames(t *testing.T) {
	var b bytes.Buffer
	if err := WriteJSON(&b, Report{Node: "n", Verdicts: Evaluate(healthy())}); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	v := m["verdicts"].([]any)[0].(map[string]any)
	for _, k := range []string{"layer", "symptom", "status", "evidence"} {
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

// TestExplainInReadme: README.md's "What each layer checks" block is the
// binary's --explain output, so a new or renamed layer updates both.
func TestExplainInReadme(t *testing.T) {
	readme, err := os.ReadFile("README.md")
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
