package injbench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

func TestReport(t *testing.T) {
	r := &Result{Runtime: "containerd v2.2.9"}
	for i, a := range []int{100, 110, 120, 130} {
		b := []int{105, 112, 131, 150}[i]
		r.Samples = append(r.Samples,
			Sample{Path: "a", Iteration: i, CreateStart: time.Duration(a) * time.Millisecond, Plugin: 10 * time.Microsecond, Sandbox: 80 * time.Millisecond},
			Sample{Path: "b", Iteration: i, CreateStart: time.Duration(b) * time.Millisecond, Plugin: 200 * time.Microsecond, Sandbox: 90 * time.Millisecond})
	}
	rep := r.Summarize()
	if rep.A.Median != 115*time.Millisecond || rep.B.Median != 121500*time.Microsecond || rep.ContainersEach != 4 {
		t.Fatalf("medians a=%v b=%v n=%d, want 115ms 121.5ms 4", rep.A.Median, rep.B.Median, rep.ContainersEach)
	}
	// b−a per iteration: 5, 2, 11, 20 ms.
	if rep.PairedDiff != 8*time.Millisecond {
		t.Errorf("paired diff = %v, want 8ms", rep.PairedDiff)
	}
	if rep.Sandbox.Median != 85*time.Millisecond {
		t.Errorf("sandbox median = %v, want 85ms over both paths", rep.Sandbox.Median)
	}

	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ratio b/a: median 1.057", "115.0ms", "121.5ms", "200µs", "design: "} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}

	line, err := rep.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		RatioMedian float64 `json:"ratio_b_a_median"`
	}
	if err := json.Unmarshal(line, &got); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	_ = json.Unmarshal(line, &raw)
	a := raw["a"].(map[string]any)
	if got.RatioMedian != 1.057 || a["median_ms"] != 115.0 || a["p90_ms"] != 130.0 || a["nri_plugin_median_ms"] != 0.01 {
		t.Errorf("JSON line = %s", line)
	}
	if bytes.ContainsRune(line, '\n') {
		t.Errorf("JSON line spans lines: %s", line)
	}
}

func TestParseCounters(t *testing.T) {
	text := `# TYPE nvinject_nri_injections_total counter
nvinject_nri_injections_total 3
# TYPE nvinject_nri_create_container_seconds histogram
nvinject_nri_create_container_seconds_bucket{le="0.001"} 4
nvinject_nri_create_container_seconds_bucket{le="+Inf"} 5
nvinject_nri_create_container_seconds_sum 0.0025
nvinject_nri_create_container_seconds_count 5
`
	after, err := parseCounters(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	inj, handler, calls := after.sub(pluginCounters{injections: 2, handlerSeconds: 0.002, handlerCalls: 4})
	if inj != 1 || calls != 1 || handler.Round(time.Microsecond) != 500*time.Microsecond {
		t.Errorf("delta = %v injections, %v, %d calls; want 1, 500µs, 1", inj, handler, calls)
	}
}

func TestGPUCheck(t *testing.T) {
	const uuid = "GPU-1"
	spec := func(ann map[string]string, devs ...oci.LinuxDevice) *oci.Spec {
		return &oci.Spec{Annotations: ann, Process: &oci.Process{Env: []string{"NVINJECT_GPU_UUID_0=" + uuid}}, Linux: &oci.Linux{Devices: devs}}
	}
	for _, tc := range []struct {
		name     string
		byPlugin bool
		spec     *oci.Spec
		wantErr  string
	}{
		{"native ok", false, spec(nil, gpuNode), ""},
		{"plugin ok", true, spec(map[string]string{uuidsAnnotation: uuid}, gpuNode), ""},
		{"no device", false, spec(nil), "lacks device"},
		{"wrong minor", false, spec(nil, oci.LinuxDevice{Path: "/dev/nvidia0", Type: "c", Major: 195, Minor: 1}), "lacks device"},
		{"plugin did not record", true, spec(nil, gpuNode), "want \"GPU-1\" from nvinject-nri"},
		{"plugin acted on baseline", false, spec(map[string]string{uuidsAnnotation: uuid}, gpuNode), "acted on the baseline"},
		{"no env", false, &oci.Spec{Linux: &oci.Linux{Devices: []oci.LinuxDevice{gpuNode}}}, "lacks env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := gpuCheck{uuid: uuid, byPlugin: tc.byPlugin}.check(tc.spec)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("check = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
