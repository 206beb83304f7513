package plugin_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/shared/contract"
)

// TestHugeAnnotationGivesShortErrorAndLog: any pod can set a 1 MiB
// annotation; the refusal kubelet shows and the plugin's log line stay
// short, name what is wrong and count what they leave out.
func TestHugeAnnotationGivesShortErrorAndLog(t *testing.T) {
	logs := &nritest.LogBuffer{}
	e := start(t, envOpts{handlerOpts: []plugin.Option{plugin.WithLogger(slog.New(slog.NewJSONHandler(logs, nil)))}})
	huge := strings.Repeat("x", 1<<20)
	many := make([]string, 5000)
	for i := range many {
		many[i] = "nvidia.com/gpu=GPU-" + strings.Repeat("a", 30) + strings.Repeat("b", i%7)
	}
	for _, tc := range []struct {
		name    string
		handler string
		podAnn  map[string]string
		ann     map[string]string
		want    string
	}{
		{"malformed nvinject annotation", "nvidia", nil, map[string]string{contract.DevicesAnnotation: huge}, contract.DevicesAnnotation},
		{"malformed cdi.k8s.io annotation", "nvidia", nil, map[string]string{"cdi.k8s.io/nvinject.gpu_0": huge + ",,"}, "cdi.k8s.io/nvinject.gpu_0"},
		{"well-formed 1 MiB name no spec defines", "nvidia", nil, map[string]string{contract.DevicesAnnotation: "nvidia.com/gpu=" + huge}, "unresolvable"},
		{"5000 GPU names outside the nvidia RuntimeClass", "", nil, map[string]string{"cdi.k8s.io/x": strings.Join(many, ",")}, "more"},
		{"1 MiB pod-level spoof", "nvidia", map[string]string{"cdi.k8s.io/x": "nvidia.com/gpu=" + huge}, nil, "pod-level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs.Take()
			_, _, err := e.create(t, nritest.Pod("p", tc.handler, tc.podAnn), tc.ann, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			if n := len(err.Error()); n > 2*contract.MaxError {
				t.Errorf("refusal is %d bytes: %.300s", n, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("refusal %.400q does not mention %q", err, tc.want)
			}
			line := logs.Take()
			if !strings.Contains(line, "refused container") {
				t.Fatalf("no refusal log line: %.300s", line)
			}
			if n := len(line); n > 2*contract.MaxError {
				t.Errorf("log line is %d bytes: %.300s", n, line)
			}
		})
	}
}
