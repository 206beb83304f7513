package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "smi-good")
	bad := filepath.Join(dir, "smi-bad")
	if err := os.WriteFile(good, []byte("#!/bin/sh\necho '0, GPU-1, A100, Disabled'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho 'NVIDIA-SMI has failed'; exit 9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	base := []string{"--no-kube", "--kubelet-dir", dir + "/none", "--cdi-spec-dir", dir + "/none",
		"--containerd-config", dir + "/none.toml", "--device-plugin-metrics", "http://127.0.0.1:1/metrics", "--nri-metrics", "http://127.0.0.1:1/metrics"}
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     string
	}{
		{"nothing broken, all else unknown", append([]string{"--nvidia-smi", good}, base...), 0, "driver        OK"},
		{"driver broken", append([]string{"--nvidia-smi", bad}, base...), 1, "fix: check the host driver"},
		{"json", append([]string{"--json", "--nvidia-smi", bad}, base...), 1, `"layer": "driver"`},
		{"bad flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"stray argument", []string{"extra"}, 2, "unexpected arguments"},
		{"help", []string{"--help"}, 0, "Usage: nvinject-doctor [flags]"},
		{"version", []string{"--version"}, 0, "nvinject-doctor dev"},
		{"explain", []string{"--explain"}, 0, "Capacity 为 1，Allocatable 为 0"},
		{"explain DRA", []string{"--explain"}, 0, "DRA node: worker sees the GPU but no ResourceSlice offers it"},
		{"bad mode", []string{"--mode", "cdi"}, 2, `--mode "cdi": want device-plugin or dra`},
		{"DRA mode, node only", append([]string{"--mode", "dra", "--nvidia-smi", good, "--dra-metrics", "http://127.0.0.1:1/metrics"}, base...), 0, "mode dra (--mode dra)"},
		{"explain help", []string{"explain", "--help"}, 0, "Usage: nvinject-doctor explain [flags] POD"},
		{"explain without a pod", []string{"explain"}, 2, "explain takes one pod name"},
		{"explain, two pods", []string{"explain", "a", "--pod-namespace", "x", "b"}, 2, `got ["a" "b"]`},
		{"explain, no API server", []string{"explain", "vllm", "--kubeconfig", dir + "/none", "--pod-namespace", "ml"}, 1, "explain ml/vllm: load kubeconfig"},
		{"deprecated alias", append([]string{"--nvidia-smi", good, "--resource=nvidia.com/gpu"}, base...), 0, "--resource is deprecated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), tt.args, &out, &errOut)
			all := out.String() + errOut.String()
			if code != tt.wantCode || !strings.Contains(all, tt.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tt.wantCode, tt.want, all)
			}
			if strings.HasPrefix(tt.name, "json") {
				var r struct {
					Verdicts []struct{ Layer, Status string }
				}
				if err := json.Unmarshal(out.Bytes(), &r); err != nil || len(r.Verdicts) != 8 || r.Verdicts[0].Status != "broken" {
					t.Errorf("json = %+v, %v", r, err)
				}
			}
		})
	}
}
