// Package simfault serves the SIMULATION-only endpoints that make
// nvinject-nri misbehave for the fault tests: POST /debug/sim/delay?d=
// (every CreateContainer of a GPU runtime handler pod waits d first) and POST /debug/sim/disconnect?for=
// (drop the NRI connection and stay away that long). The command mounts
// them only when --nvml=sim:...; a real node has none.
package simfault

import (
	"fmt"
	"net/http"
	"time"
)

// Delayer sets the simulated CreateContainer delay.
type Delayer interface{ SetSimDelay(time.Duration) }

// Disconnecter drops the NRI connection for a while.
type Disconnecter interface{ SimDisconnect(time.Duration) error }

// Routes returns the patterns and handlers to mount.
func Routes(del Delayer, dis Disconnecter) map[string]http.Handler {
	return map[string]http.Handler{
		"POST /debug/sim/delay": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, ok := duration(w, r, "d")
			if !ok {
				return
			}
			del.SetSimDelay(d)
			_, _ = fmt.Fprintf(w, "SIMULATED CreateContainer delay set to %s\n", d)
		}),
		"POST /debug/sim/disconnect": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, ok := duration(w, r, "for")
			if !ok {
				return
			}
			if err := dis.SimDisconnect(d); err != nil {
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			_, _ = fmt.Fprintf(w, "SIMULATED NRI disconnect for %s\n", d)
		}),
	}
}

func duration(w http.ResponseWriter, r *http.Request, key string) (time.Duration, bool) {
	d, err := time.ParseDuration(r.URL.Query().Get(key))
	if err != nil || d < 0 {
		http.Error(w, fmt.Sprintf("give %s=<duration>, e.g. %s=3s", key, key), http.StatusBadRequest)
		return 0, false
	}
	return d, true
}
