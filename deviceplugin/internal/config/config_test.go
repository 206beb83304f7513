package config

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

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

func TestLoadSeedEnvAndFlagPrecedence(t *testing.T) {
	uuid := "GPU-4c8f1b0e-1a2b-5c3d-8e4f-0123456789ab"
	e := env(map[string]string{
		"NVIDIA_VISIBLE_DEVICES": uuid,
		"MIG_STRATEGY":           "none",
		"DEVICE_LIST_STRATEGY":   "cdi-annotations,cdi-cri",
		"DEVICE_ID_STRATEGY":     "index",
		"NVINJECT_NVML":          "sim:a100-80gb*8,driver=535.261.03",
		"NVINJECT_HOOK_BINARY":   "/var/lib/nvinject/bin/nvinject-cdi-hook",
	})
	c, err := Load([]string{"--device-id-strategy=uuid"}, e, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.VisibleDevices != uuid || !slices.Equal(c.Selector.UUIDs, []string{uuid}) {
		t.Errorf("selection from env: %q %+v", c.VisibleDevices, c.Selector)
	}
	if c.IDStrategy != IDUUID {
		t.Errorf("flag should win over env: got %q", c.IDStrategy)
	}
	if c.NVML != "sim:a100-80gb*8,driver=535.261.03" {
		t.Errorf("nvml = %q", c.NVML)
	}
	if c.HookBinary != "/var/lib/nvinject/bin/nvinject-cdi-hook" {
		t.Errorf("hook binary from NVINJECT_HOOK_BINARY = %q", c.HookBinary)
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
		{env: map[string]string{"MIG_STRATEGY": "single"}, want: `MIG_STRATEGY="single"`},
		{env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "gpu0"}, want: `"gpu0" is neither`},
		{args: []string{"--nvml=cuda"}, want: `--nvml="cuda"`},
		{args: []string{"--ignored-xids=13,x"}, want: `"x" is not an Xid`},
		{args: []string{"--health-quiet-period=soon"}, want: `invalid value "soon" for flag -health-quiet-period`},
		{args: []string{"--health-quiet-period=-1s"}, want: `--health-quiet-period=-1s is negative`},
		{env: map[string]string{"NVINJECT_HEALTH_QUIET_PERIOD": "300"}, want: `NVINJECT_HEALTH_QUIET_PERIOD="300"`},
		{args: []string{"--on-nvml-error=retry"}, want: `--on-nvml-error="retry"`},
		{args: []string{"--resource-name=gpu"}, want: `--resource-name="gpu"`},
		{args: []string{"--cdi-vendor=-x"}, want: `--cdi-vendor="-x"`},
		{args: []string{"--plugin-socket=kubelet.sock"}, want: `--plugin-socket="kubelet.sock"`},
		{args: []string{"--kubelet-dir=/" + strings.Repeat("d", 120)}, want: "unix sockets allow 107"},
		{args: []string{"extra"}, want: "unexpected arguments"},
		{args: []string{"--hook-binary=bin/nvinject-cdi-hook"}, want: `--hook-binary="bin/nvinject-cdi-hook" is not an absolute path`},
		{env: map[string]string{"NVINJECT_POD_RESOURCES_SOCKET": "kubelet.sock"}, want: `--pod-resources-socket="kubelet.sock" is not an absolute path`},
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

// TestPodResourcesSocket: on by default at kubelet's socket, set by flag or
// NVINJECT_POD_RESOURCES_SOCKET, off only when given empty.
func TestPodResourcesSocket(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{want: "/var/lib/kubelet/pod-resources/kubelet.sock"},
		{env: map[string]string{"NVINJECT_POD_RESOURCES_SOCKET": "/k/pr.sock"}, want: "/k/pr.sock"},
		{args: []string{"--pod-resources-socket="}, env: map[string]string{"NVINJECT_POD_RESOURCES_SOCKET": "/k/pr.sock"}, want: ""},
	} {
		c, err := Load(tt.args, env(tt.env), io.Discard, io.Discard)
		if err != nil || c.PodResourcesSocket != tt.want {
			t.Errorf("Load(%v, %v): socket %q, %v; want %q", tt.args, tt.env, c.PodResourcesSocket, err, tt.want)
		}
	}
}
