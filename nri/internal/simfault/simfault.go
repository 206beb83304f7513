//go:build !nosim

// Package simfault is SIMULATION-only equipment: the faults the fault tests
// play on nvinject-nri. Slow holds up every CreateContainer of a served
// runtime handler's pod (--sim-delay, POST /debug/sim/delay?d=); POST
// /debug/sim/disconnect?for= drops the NRI connection and stays away that
// long. The command wires it only when --nvml=sim:...; a real node has none.
package simfault

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/plugin"
)

// Slow is the handler with every CreateContainer of a served runtime
// handler's pod waiting the delay first, inside the handler's request
// deadline, as real slowness would (other pods skip the GPU work).
type Slow struct {
	*plugin.Handler
	delay atomic.Int64
}

// NewSlow returns h slowed by d.
func NewSlow(h *plugin.Handler, d time.Duration) *Slow {
	s := &Slow{Handler: h}
	s.SetDelay(d)
	return s
}

// SetDelay sets the delay of the CreateContainer calls that follow.
func (s *Slow) SetDelay(d time.Duration) { s.delay.Store(int64(d)) }

// CreateContainer waits the delay, or until the request's deadline, then
// runs the handler's CreateContainer in what is left of that deadline.
func (s *Slow) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	d := time.Duration(s.delay.Load())
	if d <= 0 {
		return s.Handler.CreateContainer(ctx, pod, ctr)
	}
	return s.CreateContainerAfter(ctx, func(ctx context.Context) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}, pod, ctr)
}

// Delayer sets the CreateContainer delay (Slow).
type Delayer interface{ SetDelay(time.Duration) }

// Reconnecter drops the NRI connection and connects again after a while
// (conn.Runner).
type Reconnecter interface{ Reconnect(time.Duration) error }

// Routes returns the patterns and handlers to mount.
func Routes(del Delayer, dis Reconnecter) map[string]http.Handler {
	return map[string]http.Handler{
		"POST /debug/sim/delay": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, ok := duration(w, r, "d")
			if !ok {
				return
			}
			del.SetDelay(d)
			_, _ = fmt.Fprintf(w, "SIMULATED CreateContainer delay set to %s\n", d)
		}),
		"POST /debug/sim/disconnect": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, ok := duration(w, r, "for")
			if !ok {
				return
			}
			if err := dis.Reconnect(d); err != nil {
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
