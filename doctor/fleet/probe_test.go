package fleet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestProxyProber runs ProxyProber against a stand-in API server: the
// daemon's 503 body is its answer, the API server's own Status an error.
func TestProxyProber(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/namespaces/ns/pods/http:ready:9481/proxy/readyz":
			w.Write([]byte("ok\n"))
		case "/api/v1/namespaces/ns/pods/http:starting:9481/proxy/readyz":
			http.Error(w, "not ready: NVML: Driver Not Loaded", http.StatusServiceUnavailable)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"error trying to reach service: dial tcp 10.0.0.9:9481: connect: connection refused","code":503}`))
		}
	}))
	defer srv.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	p := ProxyProber{Client: cs}
	tests := []struct {
		pod, body, err string
	}{
		{"ready", "ok\n", ""},
		{"starting", "not ready: NVML: Driver Not Loaded\n", ""},
		{"gone", "", "error trying to reach service: dial tcp"},
	}
	for _, tt := range tests {
		body, err := p.Readyz(context.Background(), "ns", tt.pod, 9481)
		if body != tt.body || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%s: %q, %v; want %q, %q", tt.pod, body, err, tt.body, tt.err)
		}
	}
}
