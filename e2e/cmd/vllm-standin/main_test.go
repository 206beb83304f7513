package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func fakeSMI(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "nvidia-smi")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProbe(t *testing.T) {
	gpus, err := probe(fakeSMI(t, "echo 'GPU-abc, NVIDIA A100-SXM4-80GB, 81920 MiB'\n"))
	if err != nil || len(gpus) != 1 || gpus[0].UUID != "GPU-abc" || gpus[0].Memory != "81920 MiB" {
		t.Fatalf("probe = %+v, %v", gpus, err)
	}
	if _, err := probe(fakeSMI(t, "echo 'No devices were found'; exit 6\n")); err == nil || !strings.Contains(err.Error(), "No devices") {
		t.Fatalf("probe without GPU: %v", err)
	}
}

func TestCompletion(t *testing.T) {
	s := &server{model: "m", gpus: []GPU{{UUID: "GPU-abc", Name: "A100"}}, env: []string{"NVINJECT_GPU_UUID_0=GPU-abc"}}
	srv := httptest.NewServer(s.routes())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"San Francisco is a","max_tokens":8}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Object  string `json:"object"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		NVInject struct {
			NvidiaSMI []GPU `json:"nvidia_smi"`
		} `json:"nvinject"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Object != "text_completion" || len(out.Choices) != 1 || !strings.Contains(out.Choices[0].Text, "GPU-abc") || out.NVInject.NvidiaSMI[0].UUID != "GPU-abc" {
		t.Fatalf("reply = %+v", out)
	}
	resp2, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"other"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusNotFound {
		t.Errorf("wrong model status = %d", resp2.StatusCode)
	}
}
