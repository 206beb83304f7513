package main_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/shared/contract"
)

// TestBinary runs the built nvinject-nri against the in-process NRI
// runtime, configured by flags only, as a node would run it.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "nvinject-nri")
	build := exec.Command("go", "build", "-tags", "nri_no_wasm", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	node := nritest.NewNode(t, "sim:a100-80gb*2", false)
	sockDir, err := os.MkdirTemp("", "nvnri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	rt := nritest.NewRuntime(filepath.Join(sockDir, "nri.sock"), nil, nil)
	rt.Start(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "--socket-path", rt.Socket, "--cdi-spec-dir", node.SpecDir, "--nvml", "sim:a100-80gb*2",
		"--metrics-addr", addr, "--log-format", "text")
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	rt.WaitSynced(t)

	s := nritest.BaseSpec()
	ctr := nritest.Container("c", "p", "main", s, map[string]string{contract.DevicesAnnotation: node.Name(1)})
	adj, err := rt.Create(context.Background(), nritest.Pod("p", "nvidia", nil), ctr)
	if err != nil {
		t.Fatalf("CreateContainer: %v\n%s", err, logs.String())
	}
	nritest.Apply(t, s, adj)
	if got := s.Annotations["nvinject.io/gpu-uuids"]; got != node.Devices[1].UUID {
		t.Errorf("gpu-uuids annotation = %q, want %s", got, node.Devices[1].UUID)
	}
	for path, want := range map[string]string{"/readyz": "ok", "/metrics": "nvinject_nri_injections_total 1"} {
		body := get(t, "http://"+addr+path)
		if !strings.Contains(body, want) {
			t.Errorf("GET %s does not contain %q:\n%s", path, want, body)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "injected GPUs") {
		t.Errorf("no injection log line:\n%s", logs.String())
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
