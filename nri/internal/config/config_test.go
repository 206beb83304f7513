package config

import (
	"io"
	"slices"
	"testing"
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

func TestInvalid(t *testing.T) {
	for _, args := range [][]string{
		{"--plugin-idx", "5"},
		{"--plugin-name", ""},
		{"--runtime-handler", ""},
		{"--cdi-vendor", ""},
		{"extra"},
		{"--no-such-flag"},
	} {
		if _, err := Parse(args, io.Discard); err == nil {
			t.Errorf("Parse(%q) accepted", args)
		}
	}
}
