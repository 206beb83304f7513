package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/shared/contract"
)

// TestBinary runs the built nvinject-nri against the in-process NRI
// runtime, configured by flags only, as a node would run it, with an API
// server that takes its audit Events.
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
	events, hang, kubeconfig := fakeAPI(t)
	cmd := exec.Command(bin, "--socket-path", rt.Socket, "--cdi-spec-dir", node.SpecDir, "--nvml", "sim:a100-80gb*2",
		"--metrics-addr", addr, "--log-format", "text", "--kubeconfig", kubeconfig, "--node-name", "node-1")
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
	select {
	case ev := <-events:
		n, err := contract.ParseAuditNote(ev.Message)
		if ev.Reason != contract.EventReasonGPUAdmitted || ev.InvolvedObject.Kind != "Pod" || ev.InvolvedObject.Name != "pod-p" ||
			ev.Source.Host != "node-1" || err != nil || !strings.Contains(n.Verdict, node.Devices[1].UUID) {
			t.Errorf("audit Event %s on %+v from %+v: %q (%v)", ev.Reason, ev.InvolvedObject, ev.Source, ev.Message, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no audit Event reached the API server\n%s", logs.String())
	}
	for _, c := range [][2]string{{"/readyz", "ok"}, {"/metrics", "nvinject_nri_injections_total 1"}, {"/metrics", contract.MetricNRIAuditEnabled + " 1"},
		{"/metrics", contract.MetricNRIAuditEvents + `{outcome="sent"} 1`}} {
		if body := get(t, "http://"+addr+c[0]); !strings.Contains(body, c[1]) {
			t.Errorf("GET %s does not contain %q:\n%s", c[0], c[1], body)
		}
	}
	// With simulated GPUs the simulation's fault routes are mounted.
	resp, err := http.Post("http://"+addr+"/debug/sim/delay?d=0s", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "SIMULATED CreateContainer delay set to 0s") {
		t.Errorf("POST /debug/sim/delay: %s %q", resp.Status, body)
	}
	// A hung API server changes no verdict and slows none; SIGTERM still
	// ends the process at once (the audit writer's request is cancelled).
	hang()
	for i := range 20 {
		c := nritest.Container(fmt.Sprint("c", i), "p", "main", nritest.BaseSpec(), map[string]string{contract.DevicesAnnotation: node.Name(1)})
		t0 := time.Now()
		if _, err := rt.Create(context.Background(), nritest.Pod("p", "nvidia", nil), c); err != nil || time.Since(t0) > 500*time.Millisecond {
			t.Fatalf("with the API server hung, CreateContainer took %s: %v", time.Since(t0), err)
		}
	}
	t0 := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil || time.Since(t0) > 3*time.Second {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), "injected GPUs") {
		t.Errorf("no injection log line:\n%s", logs.String())
	}
}

// fakeAPI is an API server taking Event creations; it returns them, a
// func that makes it hang from then on, and a kubeconfig naming it.
func fakeAPI(t *testing.T) (<-chan corev1.Event, func(), string) {
	t.Helper()
	events := make(chan corev1.Event, 16)
	hung, done := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// client-go sends JSON or protobuf; the scheme reads either.
		body, _ := io.ReadAll(r.Body)
		select {
		case <-hung:
			select {
			case <-r.Context().Done():
			case <-done:
			}
			return
		default:
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
		ev, ok := obj.(*corev1.Event)
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/events") || err != nil || !ok {
			http.Error(w, fmt.Sprintf("not an Event creation: %s %s %s: %v", r.Method, r.URL.Path, r.Header.Get("Content-Type"), err), http.StatusBadRequest)
			return
		}
		events <- *ev
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(ev)
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n", srv.URL)
	if err := os.WriteFile(kubeconfig, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return events, func() { close(hung) }, kubeconfig
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
