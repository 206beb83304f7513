package simdebug

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/nvinject/nvinject/gpunode/health"
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

func TestRoutes(t *testing.T) {
	f := &fake{}
	mux := http.NewServeMux()
	for p, h := range Routes(f, f) {
		mux.Handle(p, h)
	}
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
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(tc.method, tc.url, nil))
		if w.Code != tc.want {
			t.Errorf("%s %s = %d; want %d (%s)", tc.method, tc.url, w.Code, tc.want, w.Body)
		}
	}
	if !slices.Equal(f.xids, []uint64{79}) || !slices.Equal(f.faults, []sim.Fault{sim.FaultECC, sim.FaultRowRemapFailure}) || f.clears != 1 {
		t.Fatalf("injected xids %v faults %v clears %d", f.xids, f.faults, f.clears)
	}
}
