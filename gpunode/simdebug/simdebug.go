// Package simdebug serves the SIMULATION-only endpoints that inject health
// events and faults:
//
//	POST /debug/sim/xid?uuid=&xid=            an Xid through the simulated NVML event set
//	POST /debug/sim/fault?uuid=&fault=        an NVML health fault (lost, retired-pages-pending,
//	                                          row-remap-failure, row-remap-pending, ecc)
//	POST /debug/sim/clear-faults?uuid=        ends the GPU's faults, as a GPU reset would
//	POST /debug/sim/recover?uuid=             operator recovery of one GPU (asks NVML first)
//
// The GPU node (gpunode.Node) mounts them only when --nvml=sim:...; a real
// node has none.
package simdebug

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// Injector delivers simulated Xids and faults through the simulated NVML.
type Injector interface {
	InjectXid(uuid string, xid uint64) error
	InjectFault(uuid string, f sim.Fault) error
	ClearFaults(uuid string) error
}

// Recoverer clears a GPU's Unhealthy mark (the operator action) if NVML
// vouches for it.
type Recoverer interface {
	Recover(ctx context.Context, uuid string) error
}

// Routes returns the patterns and handlers to mount.
func Routes(inj Injector, rec Recoverer) map[string]http.Handler {
	return map[string]http.Handler{
		"POST /debug/sim/xid": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			xid, err := strconv.ParseUint(r.URL.Query().Get("xid"), 10, 64)
			if uuid == "" || err != nil {
				http.Error(w, "give uuid=<GPU UUID> and xid=<number>", http.StatusBadRequest)
				return
			}
			if err := inj.InjectXid(uuid, xid); err != nil {
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			_, _ = fmt.Fprintf(w, "SIMULATED Xid %d injected on %s\n", xid, uuid)
		}),
		"POST /debug/sim/fault": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			f, err := sim.ParseFault(r.URL.Query().Get("fault"))
			if uuid == "" || err != nil {
				http.Error(w, fmt.Sprintf("give uuid=<GPU UUID> and fault=<name>: %v", err), http.StatusBadRequest)
				return
			}
			if err := inj.InjectFault(uuid, f); err != nil {
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			_, _ = fmt.Fprintf(w, "SIMULATED fault %s set on %s\n", f, uuid)
		}),
		"POST /debug/sim/clear-faults": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			if uuid == "" {
				http.Error(w, "give uuid=<GPU UUID>", http.StatusBadRequest)
				return
			}
			if err := inj.ClearFaults(uuid); err != nil {
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			_, _ = fmt.Fprintf(w, "SIMULATED faults of %s cleared\n", uuid)
		}),
		"POST /debug/sim/recover": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			if uuid == "" {
				http.Error(w, "give uuid=<GPU UUID>", http.StatusBadRequest)
				return
			}
			switch err := rec.Recover(r.Context(), uuid); {
			case errors.Is(err, health.ErrUnknownGPU):
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			case err != nil:
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			_, _ = fmt.Fprintf(w, "%s marked Healthy\n", uuid)
		}),
	}
}
