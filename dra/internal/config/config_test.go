package config_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/dra/internal/config"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadDefaultsAndEnv(t *testing.T) {
	c, err := config.Load(nil, env(map[string]string{
		"NODE_NAME": "worker", "NVIDIA_VISIBLE_DEVICES": "GPU-abc", "NVINJECT_NVML": "sim:a100-80gb",
		"NVINJECT_KUBELET_PLUGINS_DIR": "/x/plugins",
	}), &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "worker" || c.VisibleDevices != "GPU-abc" || c.NVML != "sim:a100-80gb" || c.Kubeconfig != "" {
		t.Errorf("config = %+v", c)
	}
	if c.StateDir != "/x/plugins/gpu.nvinject.io" || c.DriverPluginDir() != "/x/plugins/gpu.nvinject.io" {
		t.Errorf("state dir %s, plugin dir %s; want both under /x/plugins/gpu.nvinject.io", c.StateDir, c.DriverPluginDir())
	}
	if c.MetricsAddr != ":9483" || c.Log.Format != "json" {
		t.Errorf("metrics %s, log format %s", c.MetricsAddr, c.Log.Format)
	}
	// A DRA node publishes MIG devices unless told otherwise.
	if c.MIGStrategy != gpuselect.MIGMixed {
		t.Errorf("MIG strategy %q, want mixed", c.MIGStrategy)
	}
	if c.Shares {
		t.Error("GPU shares on by default")
	}
	if c, err := config.Load([]string{"--node-name=n"}, env(map[string]string{"NVINJECT_GPU_SHARES": "true"}), &bytes.Buffer{}, &bytes.Buffer{}); err != nil || !c.Shares {
		t.Errorf("NVINJECT_GPU_SHARES=true: shares %v, %v", c.Shares, err)
	}
	// The command line wins over the environment.
	c, err = config.Load([]string{"--node-name=cli"}, env(map[string]string{"NODE_NAME": "env"}), &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil || c.NodeName != "cli" {
		t.Errorf("node name %q, %v; want cli", c.NodeName, err)
	}
}

func TestLoadRejects(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--node-name is empty"},
		{[]string{"--node-name=n", "--kubelet-plugins-dir=plugins"}, "absolute"},
		{[]string{"--node-name=n", "--kubelet-plugins-dir=/" + strings.Repeat("p", 120)}, "107"},
		{[]string{"--node-name=n", "extra"}, "unexpected arguments"},
		{[]string{"--node-name=n", "--kubelet-dir=dp"}, "or --hold-resource-endpoint=false"},
		// The GPU node's settings are checked with the driver's own.
		{[]string{"--nvml=gpu"}, "--nvml"},
		{[]string{"--nvml=gpu"}, "--node-name is empty"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		// A share is enforced by its own MPS daemon.
		{[]string{"--node-name=n", "--gpu-shares", "--mps-dir="}, "--gpu-shares needs --mps-dir"},
	} {
		_, err := config.Load(tc.args, env(nil), &bytes.Buffer{}, &bytes.Buffer{})
		var ue cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%q) = %v; want a usage error containing %q", tc.args, err, tc.want)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, arg := range []string{"--help", "--version"} {
		var out bytes.Buffer
		_, err := config.Load([]string{arg}, env(nil), &out, &bytes.Buffer{})
		if !config.ErrHelp(err) || !strings.Contains(out.String(), "nvinject-dra") {
			t.Errorf("%s: err %v, stdout %q", arg, err, out.String())
		}
	}
	var out bytes.Buffer
	_, _ = config.Load([]string{"--help"}, env(nil), &out, &bytes.Buffer{})
	for _, s := range []string{"NVIDIA_VISIBLE_DEVICES", "NODE_NAME", "NVINJECT_STATE_DIR", "gpu.nvinject.io"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("--help lacks %s", s)
		}
	}
}
