package gpunode

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// request sends method url and returns the status and body; 0 while
// nothing listens yet.
func request(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// until polls ok every 5 ms for up to 10 s.
func until(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Under --nvml=sim:... New bolts on the simulation's seam by itself: its
// fault routes answer from the start, 503 saying the simulated node is not
// open while the simulated NVML cannot open (the driver root holds a driver
// older than the simulation knows); once the root is fixed the node opens
// NVML through the seam, and an Xid posted there takes a GPU off and
// recover brings it back.
func TestSimulationSeam(t *testing.T) {
	bad := t.TempDir()
	lib := filepath.Join(bad, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libnvidia-ml.so.390.157"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libnvidia-ml.so.390.157", filepath.Join(lib, "libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	// The driver root is a link, first to the old driver, then to the
	// simulated node's root.
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Symlink(bad, root); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	base := "http://" + addr
	tracker := make(chan *health.Tracker, 1)
	n := New(config(t, "--driver-root="+root, "--metrics-addr="+addr, "--health-quiet-period=1h"), quietLog(),
		WithNVMLRetry(10*time.Millisecond), WithOnPublish(func(g GPUs) { tracker <- g.Health }))
	run(t, n, func(ctx context.Context, _ GPUs) error {
		<-ctx.Done()
		return nil
	})
	// Through the endpoint: the HTTP server starts beside NVML's first open.
	until(t, "readyz saying NVML fails to open", func() bool {
		code, body := request(t, "GET", base+"/readyz")
		return code == 503 && strings.Contains(body, "older than the simulation knows")
	})
	uuid := simUUID(1)
	for _, route := range []string{"xid?uuid=" + uuid + "&xid=79", "fault?uuid=" + uuid + "&fault=lost", "clear-faults?uuid=" + uuid, "recover?uuid=" + uuid} {
		want := "the simulated node is not open yet"
		if strings.HasPrefix(route, "recover") {
			want = "health tracking has not started yet"
		}
		if code, body := request(t, "POST", base+"/debug/sim/"+route); code != 503 || !strings.Contains(body, want) {
			t.Errorf("POST /debug/sim/%s before the node opened = %d %q; want 503 with %q", route, code, body, want)
		}
	}

	good := filepath.Join(filepath.Dir(root), "good")
	if err := os.Symlink(roots.Get(t, nvmlSpec), good); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(good, root); err != nil {
		t.Fatal(err)
	}
	var tr *health.Tracker
	select {
	case tr = <-tracker:
	case <-time.After(10 * time.Second):
		t.Fatalf("the GPUs were never published: %v", n.Ready())
	}
	<-tr.Monitored()
	if code, body := request(t, "POST", base+"/debug/sim/xid?uuid="+uuid+"&xid=79"); code != 200 || !strings.Contains(body, "SIMULATED Xid 79 injected") {
		t.Fatalf("POST xid once open = %d %q", code, body)
	}
	until(t, "GPU 1 Unhealthy after the posted Xid 79", func() bool { return !tr.Healthy(uuid) })
	if code, body := request(t, "POST", base+"/debug/sim/recover?uuid="+uuid); code != 200 {
		t.Fatalf("POST recover once open = %d %q", code, body)
	}
	if !tr.Healthy(uuid) {
		t.Fatal("GPU 1 still Unhealthy after recover")
	}
}

// A node on real NVML has none of the simulation's routes: 404, while its
// own endpoints answer.
func TestRealNodeHasNoSimulationRoutes(t *testing.T) {
	addr := freeAddr(t)
	base := "http://" + addr
	n := New(config(t, "--nvml=real", "--metrics-addr="+addr), quietLog(), WithNVMLRetry(time.Hour),
		WithOpen(func(string, backend.Options) (*backend.Backend, error) {
			return nil, errors.New("no NVML in this test")
		}))
	run(t, n, func(context.Context, GPUs) error { t.Error("served without NVML"); return nil })
	until(t, "the metrics address serving", func() bool { code, _ := request(t, "GET", base+"/healthz"); return code == 200 })
	if code, body := request(t, "GET", base+"/readyz"); code != 503 || !strings.Contains(body, "no NVML in this test") {
		t.Errorf("/readyz = %d %q; want 503 with the NVML error", code, body)
	}
	for _, route := range []string{"xid?uuid=GPU-a&xid=79", "fault?uuid=GPU-a&fault=lost", "clear-faults?uuid=GPU-a", "recover?uuid=GPU-a"} {
		for _, method := range []string{"POST", "GET"} {
			if code, body := request(t, method, base+"/debug/sim/"+route); code != 404 {
				t.Errorf("%s /debug/sim/%s on a real node = %d %q; want 404", method, route, code, body)
			}
		}
	}
}
