package config

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
)

// env is m, with NODE_NAME node-1 unless m sets it: the labels' Node.
func env(m map[string]string) func(string) string {
	return func(k string) string {
		if v, ok := m[k]; ok || k != "NODE_NAME" {
			return v
		}
		return "node-1"
	}
}

func TestLoadDefaults(t *testing.T) {
	c, err := Load(nil, env(nil), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Strategies, contract.DefaultStrategies()) || c.IDStrategy != IDUUID ||
		c.KubeletDir != "/var/lib/kubelet/device-plugins" || c.ResourceName != "nvidia.com/gpu" ||
		c.MetricsAddr != ":9481" || !c.Selector.All || c.QuietPeriod != 5*time.Minute ||
		!slices.Equal(c.IgnoredXids, []uint64{13, 31, 43, 45, 68, 109}) {
		t.Fatalf("defaults: %+v", c)
	}
}

// NVIDIA's DEVICE_*_STRATEGY names are read; the command line wins;
// the GPU node's settings come with them (gpunode/nodeconfig).
func TestLoadNVIDIAEnvAndFlagPrecedence(t *testing.T) {
	uuid := "GPU-4c8f1b0e-1a2b-5c3d-8e4f-0123456789ab"
	e := env(map[string]string{
		"NVIDIA_VISIBLE_DEVICES": uuid,
		"DEVICE_LIST_STRATEGY":   "nri",
		"DEVICE_ID_STRATEGY":     "index",
	})
	c, err := Load([]string{"--device-id-strategy=uuid"}, e, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.VisibleDevices != uuid || !slices.Equal(c.Strategies, []contract.Strategy{contract.StrategyNRI}) {
		t.Errorf("from env: visible devices %q, strategies %v", c.VisibleDevices, c.Strategies)
	}
	if c.IDStrategy != IDUUID {
		t.Errorf("flag should win over env: got %q", c.IDStrategy)
	}
}

func TestLoadRefusesInvalidValues(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{env: map[string]string{"DEVICE_LIST_STRATEGY": "envvar"}, want: `"envvar" is not supported`},
		{env: map[string]string{"DEVICE_LIST_STRATEGY": "cdi-cri,bogus"}, want: `"bogus" is not a strategy`},
		{env: map[string]string{"DEVICE_ID_STRATEGY": "serial"}, want: `DEVICE_ID_STRATEGY="serial"`},
		{args: []string{"--plugin-socket=kubelet.sock"}, want: `--plugin-socket="kubelet.sock"`},
		{args: []string{"--kubelet-dir=/" + strings.Repeat("d", 120)}, want: "unix sockets allow 107"},
		{args: []string{"extra"}, want: "unexpected arguments"},
		// The GPU node's settings are checked with the plugin's own.
		{args: []string{"--nvml=cuda", "--plugin-socket=a/b"}, want: `--nvml="cuda"`},
		{args: []string{"--nvml=cuda", "--plugin-socket=a/b"}, want: `--plugin-socket="a/b"`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			_, err := Load(tt.args, env(tt.env), io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load(%v, %v) error = %v; want it to contain %s", tt.args, tt.env, err, tt.want)
			}
		})
	}
}

// Without --node-labels the plugin needs no API server, and so no Node name.
func TestLoadWithoutNodeLabels(t *testing.T) {
	c, err := Load([]string{"--node-labels=false"}, env(map[string]string{"NODE_NAME": ""}), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeLabels || c.UsesAPI() {
		t.Errorf("node labels %v, uses the API %v; want neither", c.NodeLabels, c.UsesAPI())
	}
	// A command line from before the labels existed: they are skipped,
	// with one warning.
	c, err = Load(nil, env(map[string]string{"NODE_NAME": ""}), io.Discard, io.Discard)
	if err != nil || c.NodeLabels || c.UsesAPI() || len(c.Warnings()) != 1 || !strings.Contains(c.Warnings()[0], "not published") {
		t.Errorf("no NODE_NAME: labels %v, warnings %q, %v; want no labels and one warning", c.NodeLabels, c.Warnings(), err)
	}
	c, err = Load(nil, env(map[string]string{"NODE_NAME": "gpu-1", "KUBECONFIG": "/etc/kube.conf"}), io.Discard, io.Discard)
	if err != nil || !c.NodeLabels || c.NodeName != "gpu-1" || c.Kubeconfig != "/etc/kube.conf" {
		t.Errorf("defaults with NODE_NAME and KUBECONFIG: %+v, %v", c.Config, err)
	}
}
