package smi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// realList is a real driver's `nvidia-smi -L`: a whole GPU, and one with
// MIG mode on and two MIG devices; the simulation adds " [SIMULATED]".
const realList = `GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-bbbb) [SIMULATED]
  MIG 3g.40gb     Device  0: (UUID: MIG-1111)
  MIG 1g.10gb+me  Device  1: (UUID: MIG-2222)
`

func TestList(t *testing.T) {
	tests := []struct {
		name    string
		path    string
		want    []MIGDevice
		wantErr string
	}{
		{name: "MIG devices under their GPU", path: script(t, "cat <<'E'\n"+realList+"E"),
			want: []MIGDevice{{Parent: "GPU-bbbb", Profile: "3g.40gb", UUID: "MIG-1111"}, {Parent: "GPU-bbbb", Profile: "1g.10gb+me", UUID: "MIG-2222"}}},
		{name: "no MIG device", path: script(t, `echo "GPU 0: T4 (UUID: GPU-cccc)"`)},
		{name: "MIG line before any GPU", path: script(t, `echo "  MIG 1g.10gb Device 0: (UUID: MIG-3333)"`), wantErr: "before any GPU"},
		{name: "driver down", path: script(t, `echo "NVIDIA-SMI has failed"; exit 9`), wantErr: "-L failed (exit status 9): NVIDIA-SMI has failed"},
		{name: "absent", path: "/nonexistent/nvidia-smi", wantErr: ErrNotRun.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := List(context.Background(), tt.path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("List error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("List = %+v, %v, want %+v", got, err, tt.want)
			}
		})
	}
}
