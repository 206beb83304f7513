package allocate

import (
	"maps"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/shared/contract"
)

const (
	u0 = "GPU-4c8f1b0e-1a2b-5c3d-8e4f-0123456789ab"
	u1 = "GPU-5d9f2c1f-2b3c-5d4e-9f50-123456789abc"
)

func names(ids ...string) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = "nvidia.com/gpu=" + id
	}
	return out
}

func cdiNames(d []*pluginapi.CDIDevice) []string {
	var out []string
	for _, x := range d {
		out = append(out, x.Name)
	}
	return out
}

func TestContainer(t *testing.T) {
	tests := []struct {
		name     string
		prefix   string
		strat    []contract.Strategy
		ids      []string
		wantAnn  map[string]string
		wantCDIs string
	}{
		{name: "annotations one", prefix: "nvinject.gpu", strat: []contract.Strategy{contract.StrategyAnnotations}, ids: []string{u0},
			wantAnn: map[string]string{"cdi.k8s.io/nvinject.gpu_" + u0: "nvidia.com/gpu=" + u0}},
		{name: "annotations two", prefix: "nvinject.gpu", strat: []contract.Strategy{contract.StrategyAnnotations}, ids: []string{u0, u1},
			wantAnn: map[string]string{"cdi.k8s.io/nvinject.gpu_" + u0: "nvidia.com/gpu=" + u0 + ",nvidia.com/gpu=" + u1}},
		{name: "cri two", strat: []contract.Strategy{contract.StrategyCRI}, ids: []string{u0, u1}, wantCDIs: strings.Join(names(u0, u1), " ")},
		{name: "nri one", strat: []contract.Strategy{contract.StrategyNRI}, ids: []string{u1},
			wantAnn: map[string]string{"nvinject.io/cdi-devices": "nvidia.com/gpu=" + u1}},
		{name: "annotations and cri by index", prefix: "p", strat: []contract.Strategy{contract.StrategyAnnotations, contract.StrategyCRI}, ids: []string{"3", "5"},
			wantAnn:  map[string]string{"cdi.k8s.io/p_3": "nvidia.com/gpu=3,nvidia.com/gpu=5"},
			wantCDIs: "nvidia.com/gpu=3 nvidia.com/gpu=5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.prefix, tt.strat...)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := r.Container(tt.ids, names(tt.ids...))
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(resp.Annotations, tt.wantAnn) {
				t.Errorf("annotations = %v; want %v", resp.Annotations, tt.wantAnn)
			}
			if got := strings.Join(cdiNames(resp.CdiDevices), " "); got != tt.wantCDIs {
				t.Errorf("CdiDevices = %q; want %q", got, tt.wantCDIs)
			}
			if len(resp.Envs)+len(resp.Mounts)+len(resp.Devices) != 0 {
				t.Errorf("response carries env, mounts or device specs: %v", resp)
			}
		})
	}
}

func TestCheckRefusesLongPrefix(t *testing.T) {
	r, _ := New(strings.Repeat("p", 23), contract.StrategyAnnotations)
	err := r.Check([]string{u0})
	if err == nil || !strings.Contains(err.Error(), "--cdi-annotation-prefix") {
		t.Fatalf("Check = %v; want a refusal naming the prefix", err)
	}
	r, _ = New(strings.Repeat("p", 22), contract.StrategyAnnotations)
	if err := r.Check([]string{u0}); err != nil {
		t.Fatalf("22-char prefix with a UUID fits in 63: %v", err)
	}
	if _, err := New("p"); err == nil {
		t.Fatal("New without strategies succeeded")
	}
}
