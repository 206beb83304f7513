package config

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
)

func parse(args []string, env map[string]string) (Config, error) {
	return Parse(args, func(k string) string { return env[k] }, io.Discard, io.Discard)
}

func TestDefaults(t *testing.T) {
	c, err := parse(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.SocketPath != "/var/run/nri/nri.sock" || c.PluginName != contract.NRIPluginName || c.PluginIdx != contract.NRIPluginIndex || c.MetricsAddr != ":9482" ||
		!slices.Equal(c.CDISpecDirs, contract.CDISpecDirs()) || !slices.Equal(c.RuntimeHandlers, []string{contract.RuntimeHandler}) ||
		c.AnnotationPrefix != contract.AnnotationPrefix || c.ResourceName != contract.ResourceName || c.LogFormat != "json" {
		t.Fatalf("defaults = %+v", c)
	}
}

func TestListsEnvAndAliases(t *testing.T) {
	c, err := parse([]string{"--cdi-spec-dir", "/a,/b", "--cdi-spec-dir=/c", "--runtime-handler", "nvidia-cdi", "--pod-resources-socket", "/k.sock"},
		map[string]string{"NVINJECT_RESOURCE_NAME": "example.com/gpu", "NVINJECT_CDI_SPEC_DIR": "/ignored"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.CDISpecDirs, []string{"/a", "/b", "/c"}) || !slices.Equal(c.RuntimeHandlers, []string{"nvidia-cdi"}) ||
		c.PodResourcesSocket != "/k.sock" || c.ResourceName != "example.com/gpu" {
		t.Fatalf("got %+v", c)
	}
	var stderr bytes.Buffer
	c, err = Parse([]string{"--annotation-prefix=other"}, nil, io.Discard, &stderr)
	if err != nil || c.AnnotationPrefix != "other" || !strings.Contains(stderr.String(), "--annotation-prefix is deprecated") {
		t.Fatalf("deprecated alias: %+v %v %q", c, err, stderr.String())
	}
}

func TestDeadlineAndSimDelay(t *testing.T) {
	c, err := parse(nil, nil)
	if err != nil || c.RequestDeadline != time.Second || c.SimDelay != 0 {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	c, err = parse([]string{"--nvml=sim:a100-80gb", "--sim-delay=3s", "--request-deadline=500ms"}, nil)
	if err != nil || c.SimDelay != 3*time.Second || c.RequestDeadline != 500*time.Millisecond || !c.Simulated() {
		t.Fatalf("got %+v, %v", c, err)
	}
}

// TestAPIFlags: the audit Events' API client and node name; the node name
// comes from the downward API's NODE_NAME too. The kubeconfig is a flag (or
// NVINJECT_KUBECONFIG) only: a shell's KUBECONFIG does not send a test
// run's Events to a cluster.
func TestAPIFlags(t *testing.T) {
	c, err := parse(nil, map[string]string{"NODE_NAME": "node-1", "KUBECONFIG": "/home/x/.kube/config"})
	if err != nil || c.NodeName != "node-1" || c.Kubeconfig != "" {
		t.Fatalf("from the environment: %+v, %v", c, err)
	}
	c, err = parse([]string{"--kubeconfig=/k", "--node-name=n"}, map[string]string{"NODE_NAME": "node-1"})
	if err != nil || c.NodeName != "n" || c.Kubeconfig != "/k" {
		t.Fatalf("flags: %+v, %v", c, err)
	}
}

func TestInvalid(t *testing.T) {
	for _, args := range [][]string{
		{"--plugin-idx", "5"},
		{"--plugin-name", ""},
		{"--runtime-handler", ""},
		{"--cdi-vendor", ""},
		{"--cdi-class", "-x"},
		{"extra"},
		{"--no-such-flag"},
		{"--request-deadline", "0s"},
		{"--sim-delay", "3s"},
		{"--sim-delay", "3s", "--nvml", "real"},
		{"--sim-delay", "-1s", "--nvml", "sim:a100-80gb"},
	} {
		_, err := parse(args, nil)
		var ue cli.UsageError
		if !errors.As(err, &ue) {
			t.Errorf("Parse(%q) = %v, want a usage error", args, err)
		}
	}
}
