package httpserve

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "nvinject_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	var readyErr error
	s := New("", reg, WithReady(func() error { return readyErr }))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	get := func(p string) (int, string) {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "nvinject_test_total 1") {
		t.Errorf("/metrics = %d %q", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz = %d", code)
	}
	readyErr = errors.New("kubelet not registered")
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "kubelet not registered") {
		t.Errorf("/readyz when not ready = %d %q", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestReadiness(t *testing.T) {
	r := NewReadiness("starting")
	if err := r.Ready(); err == nil || err.Error() != "starting" {
		t.Fatalf("Ready = %v, want starting", err)
	}
	r.SetReady()
	if err := r.Ready(); err != nil {
		t.Fatalf("Ready after SetReady = %v", err)
	}
	r.SetNotReady("kubelet gone")
	if err := r.Ready(); err == nil || err.Error() != "kubelet gone" {
		t.Fatalf("Ready = %v", err)
	}
}
