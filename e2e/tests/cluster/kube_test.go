package cluster

import (
	"slices"
	"testing"
)

func TestInjectedUUIDs(t *testing.T) {
	const u1, u2 = "GPU-4f1c7a52-9b7e-4c1d-8a3e-000000000001", "GPU-4f1c7a52-9b7e-4c1d-8a3e-000000000002"
	log := `time=x level=INFO msg="synchronized with runtime" containers=3
time=x level=INFO msg="injected GPUs" pod=default/vllm-demo-abc container=vllm runtimeHandler=nvidia uuids=[` + u1 + `] cdiDevices=[nvidia.com/gpu=` + u1 + `]
{"level":"INFO","msg":"injected GPUs","pod":"default/other","uuids":["` + u2 + `"]}
`
	tests := []struct {
		pod  string
		want []string
	}{
		{"default/vllm-demo-abc", []string{u1, u1}},
		{"default/other", []string{u2}},
		{"default/none", nil},
	}
	for _, tt := range tests {
		if got := InjectedUUIDs(log, tt.pod); !slices.Equal(got, tt.want) {
			t.Errorf("InjectedUUIDs(%s) = %v, want %v", tt.pod, got, tt.want)
		}
	}
}
