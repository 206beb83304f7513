package config

import (
	"io"
	"slices"
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	c, err := Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.SocketPath != "/var/run/nri/nri.sock" || c.PluginName != "nvinject" || c.PluginIdx != "10" || c.MetricsAddr != ":9482" ||
		!slices.Equal(c.CDISpecDirs, []string{"/etc/cdi", "/var/run/cdi"}) || !slices.Equal(c.RuntimeHandlers, []string{"nvidia"}) {
		t.Fatalf("defaults = %+v", c)
	}
}

func TestRepeatableFlagsReplaceDefaults(t *testing.T) {
	c, err := Parse([]string{"--cdi-spec-dir", "/a", "--cdi-spec-dir=/b", "--runtime-handler", "nvidia-cdi", "--pod-resources-socket", "/k.sock"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.CDISpecDirs, []string{"/a", "/b"}) || !slices.Equal(c.RuntimeHandlers, []string{"nvidia-cdi"}) || c.PodResourcesSocket != "/k.sock" {
		t.Fatalf("got %+v", c)
	}
	if !slices.Equal(DefaultSpecDirs, []string{"/etc/cdi", "/var/run/cdi"}) {
		t.Fatalf("defaults were mutated: %v", DefaultSpecDirs)
	}
}

func TestDeadlineAndSimDelay(t *testing.T) {
	c, err := Parse(nil, io.Discard)
	if err != nil || c.RequestDeadline != time.Second || c.SimDelay != 0 {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	c, err = Parse([]string{"--nvml=sim:a100-80gb", "--sim-delay=3s", "--request-deadline=500ms"}, io.Discard)
	if err != nil || c.SimDelay != 3*time.Second || c.RequestDeadline != 500*time.Millisecond || !c.Simulated() {
		t.Fatalf("got %+v, %v", c, err)
	}
}

func TestInvalid(t *testing.T) {
	for _, args := range [][]string{
		{"--plugin-idx", "5"},
		{"--plugin-name", ""},
		{"--runtime-handler", ""},
		{"--cdi-vendor", ""},
		{"extra"},
		{"--no-such-flag"},
		{"--request-deadline", "0s"},
		{"--sim-delay", "3s"},
		{"--sim-delay", "3s", "--nvml", "real"},
		{"--sim-delay", "-1s", "--nvml", "sim:a100-80gb"},
	} {
		if _, err := Parse(args, io.Discard); err == nil {
			t.Errorf("Parse(%q) accepted", args)
		}
	}
}
