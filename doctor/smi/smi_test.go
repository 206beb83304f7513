package smi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nvidia-smi")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		wantGPUs   int
		wantUUID   string
		wantFailed bool
		wantNotRun bool
	}{
		{name: "one GPU", path: script(t, `echo "0, GPU-1111, NVIDIA A100-SXM4-80GB, Disabled"`), wantGPUs: 1, wantUUID: "GPU-1111"},
		{name: "driver down", path: script(t, `echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."; exit 9`), wantFailed: true},
		{name: "garbage", path: script(t, `echo "weird"`), wantFailed: true},
		{name: "absent", path: "/nonexistent/nvidia-smi", wantNotRun: true},
		{name: "empty", path: " ", wantNotRun: true},
		{name: "through a prefix", path: "env NVINJECT=1 " + script(t, `echo "0, GPU-2222, A100, Disabled"`), wantGPUs: 1, wantUUID: "GPU-2222"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Run(context.Background(), tt.path)
			if tt.wantNotRun {
				if !errors.Is(err, ErrNotRun) {
					t.Fatalf("Run error = %v, want ErrNotRun", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (r.Failed != "") != tt.wantFailed || len(r.GPUs) != tt.wantGPUs {
				t.Fatalf("Run = %+v", r)
			}
			if tt.wantUUID != "" && r.GPUs[0].UUID != tt.wantUUID {
				t.Errorf("UUID = %q, want %q", r.GPUs[0].UUID, tt.wantUUID)
			}
		})
	}
}

func TestParseMIGPending(t *testing.T) {
	gpus, err := Parse("0, GPU-1, A100, Disabled, Enabled\n1, GPU-2, T4, [N/A], [N/A]\n2, GPU-3, A100, Enabled\n")
	if err != nil {
		t.Fatal(err)
	}
	if gpus[0].MIGMode != "Disabled" || gpus[0].MIGPending != "Enabled" || gpus[1].MIGPending != "[N/A]" || gpus[2].MIGPending != "" {
		t.Errorf("parsed %+v", gpus)
	}
}
