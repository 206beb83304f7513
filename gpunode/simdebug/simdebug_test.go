package simdebug

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

type fake struct {
	xids   []uint64
	faults []sim.Fault
	clears int
}

func (f *fake) InjectXid(_ string, xid uint64) error { f.xids = append(f.xids, xid); return nil }
func (f *fake) InjectFault(uuid string, fl sim.Fault) error {
	if uuid != "GPU-a" {
		return errors.New("no such simulated GPU")
	}
	f.faults = append(f.faults, fl)
	return nil
}
func (f *fake) ClearFaults(string) error { f.clears++; return nil }
func (f *fake) Recover(_ context.Context, uuid string) error {
	switch uuid {
	case "GPU-a":
		return nil
	case "GPU-sick":
		return errors.New("GPU GPU-sick stays Unhealthy: NVML: row remapping failed")
	}
	return fmt.Errorf("recover %s: %w", uuid, health.ErrUnknownGPU)
}

func mux(routes map[string]http.Handler) *http.ServeMux {
	m := http.NewServeMux()
	for p, h := range routes {
		m.Handle(p, h)
	}
	return m
}

func serve(m http.Handler, method, url string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	m.ServeHTTP(w, httptest.NewRequest(method, url, nil))
	return w
}

func TestRoutes(t *testing.T) {
	f := &fake{}
	m := mux(routes(func() (injector, error) { return f, nil }, func() (recoverer, error) { return f, nil }))
	for _, tc := range []struct {
		method, url string
		want        int
	}{
		{"POST", "/debug/sim/xid?uuid=GPU-a&xid=79", 200},
		{"POST", "/debug/sim/xid?uuid=GPU-a&xid=x", 400},
		{"GET", "/debug/sim/xid?uuid=GPU-a&xid=79", 405},
		{"POST", "/debug/sim/fault?uuid=GPU-a&fault=ecc", 200},
		{"POST", "/debug/sim/fault?uuid=GPU-a&fault=row-remap-failure", 200},
		{"POST", "/debug/sim/fault?uuid=GPU-a&fault=melted", 400},
		{"POST", "/debug/sim/fault?uuid=GPU-b&fault=lost", 409},
		{"POST", "/debug/sim/clear-faults?uuid=GPU-a", 200},
		{"POST", "/debug/sim/clear-faults", 400},
		{"POST", "/debug/sim/recover?uuid=GPU-a", 200},
		{"POST", "/debug/sim/recover?uuid=GPU-sick", 409},
		{"POST", "/debug/sim/recover?uuid=GPU-b", 404},
		{"POST", "/debug/sim/recover", 400},
	} {
		if w := serve(m, tc.method, tc.url); w.Code != tc.want {
			t.Errorf("%s %s = %d; want %d (%s)", tc.method, tc.url, w.Code, tc.want, w.Body)
		}
	}
	if !slices.Equal(f.xids, []uint64{79}) || !slices.Equal(f.faults, []sim.Fault{sim.FaultECC, sim.FaultRowRemapFailure}) || f.clears != 1 {
		t.Fatalf("injected xids %v faults %v clears %d", f.xids, f.faults, f.clears)
	}
}

// The seam's routes answer 503 saying what is not there yet until the
// node opens the simulated NVML through it (xid, fault, clear-faults) and
// hands it the health tracker (recover); a bad request is still 400.
func TestSeamLateBinding(t *testing.T) {
	const nvml = "sim:a100-80gb*2"
	uuid := sim.UUID("a100-80gb", 1)
	s := New()
	m := mux(s.Routes())
	expect := func(url string, code int, body string) {
		t.Helper()
		w := serve(m, "POST", url)
		if w.Code != code || !strings.Contains(w.Body.String(), body) {
			t.Errorf("POST %s = %d %q; want %d with %q", url, w.Code, w.Body, code, body)
		}
	}
	notOpen, notTracked := "the simulated node is not open yet", "health tracking has not started yet"
	expect("/debug/sim/xid?uuid="+uuid+"&xid=79", 503, notOpen)
	expect("/debug/sim/fault?uuid="+uuid+"&fault=lost", 503, notOpen)
	expect("/debug/sim/clear-faults?uuid="+uuid, 503, notOpen)
	expect("/debug/sim/recover?uuid="+uuid, 503, notTracked)
	expect("/debug/sim/xid?uuid="+uuid, 400, "give uuid=")

	if _, err := s.Open("sim:nonesuch", backend.Options{}); err == nil {
		t.Fatal("opened sim:nonesuch")
	}
	expect("/debug/sim/xid?uuid="+uuid+"&xid=79", 503, notOpen)

	b, err := s.Open(nvml, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// The simulated node answers now: nothing watches its events yet.
	expect("/debug/sim/xid?uuid="+uuid+"&xid=79", 409, "no health watcher is registered")
	expect("/debug/sim/fault?uuid="+uuid+"&fault=ecc", 200, "SIMULATED fault ecc set on "+uuid)
	expect("/debug/sim/fault?uuid=GPU-nonesuch&fault=lost", 409, "GPU-nonesuch")
	expect("/debug/sim/clear-faults?uuid="+uuid, 200, "SIMULATED faults of "+uuid+" cleared")
	expect("/debug/sim/recover?uuid="+uuid, 503, notTracked)

	s.Track(health.New([]string{uuid}))
	expect("/debug/sim/recover?uuid=GPU-nonesuch", 404, "GPU-nonesuch")
}
