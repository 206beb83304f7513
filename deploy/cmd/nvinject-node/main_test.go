package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/cli"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "config.toml")
	dropIns := filepath.Join(dir, "conf.d")
	tests := []struct {
		name    string
		args    []string
		wantErr string
		wantLog string
	}{
		{"no subcommand", nil, "a command is required: install-containerd-config", ""},
		{"unknown subcommand", []string{"install"}, `unknown command "install"`, ""},
		{"help", []string{"--help"}, "", ""},
		{"subcommand help", []string{"install-containerd-config", "--help"}, "", ""},
		{"stray argument", []string{"install-containerd-config", "extra"}, "unexpected arguments", ""},
		{"dry run", []string{"install-containerd-config", "--config", config, "--dropin-dir", dropIns, "--dry-run"}, "", "dry run: would create"},
		{"install", []string{"install-containerd-config", "--config", config, "--dropin-dir", dropIns}, "", "msg=created"},
		{"again", []string{"install-containerd-config", "--config", config, "--dropin-dir", dropIns}, "", "no changes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			err := run(tc.args, io.Discard, &logs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("run(%q) = %v, want error containing %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if code := cli.Code("nvinject-node", err, io.Discard); code != cli.ExitOK {
				t.Fatalf("run(%q): exit %d: %v", tc.args, code, err)
			}
			if !strings.Contains(logs.String(), tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, logs.String())
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dropIns, "nvinject.toml")); err != nil {
		t.Errorf("drop-in not installed: %v", err)
	}
}
