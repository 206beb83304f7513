package config

import (
	"io"
	"testing"
)

func TestStateDir(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{want: "/var/lib/nvinject/device-plugin"},
		{env: map[string]string{"NVINJECT_STATE_DIR": "/run/dp"}, want: "/run/dp"},
		{args: []string{"--state-dir=/flag"}, env: map[string]string{"NVINJECT_STATE_DIR": "/run/dp"}, want: "/flag"},
		{args: []string{"--state-dir="}, want: ""},
	}
	for _, tt := range tests {
		c, err := Load(tt.args, env(tt.env), io.Discard, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.StateDir != tt.want {
			t.Errorf("args %v env %v: state dir %q, want %q", tt.args, tt.env, c.StateDir, tt.want)
		}
	}
}
