// Package simdebug serves the SIMULATION-only endpoints that inject health
// events: POST /debug/sim/xid?uuid=&xid= and POST /debug/sim/recover?uuid=.
// The daemon mounts them only when --nvml=sim:...; a real node has none.
package simdebug

import (
	"fmt"
	"net/http"
	"strconv"
)

// Injector delivers a simulated Xid through the simulated NVML.
type Injector interface {
	InjectXid(uuid string, xid uint64) error
}

// Recoverer clears a GPU's Unhealthy mark (the operator action).
type Recoverer interface {
	Recover(uuid string) error
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
		"POST /debug/sim/recover": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			if uuid == "" {
				http.Error(w, "give uuid=<GPU UUID>", http.StatusBadRequest)
				return
			}
			if err := rec.Recover(uuid); err != nil {
				http.Error(w, err.Error(), http.StatusNotFound)
				return
			}
			_, _ = fmt.Fprintf(w, "%s marked Healthy\n", uuid)
		}),
	}
}
