//go:build !nosim

// Package simdebug is the SIMULATION's seam on the kubelet plugins' GPU
// node (gpunode): test and demo equipment, never product. Under
// --nvml=sim:... the node takes, in one place (gpunode.New), a Seam that
// opens the simulated NVML (shared/gpu/sim through
// backend.OpenSimulated) and serves these routes on the metrics address:
//
//	POST /debug/sim/xid?uuid=&xid=            an Xid through the simulated NVML event set
//	POST /debug/sim/fault?uuid=&fault=        an NVML health fault (lost, retired-pages-pending,
//	                                          row-remap-failure, row-remap-pending, ecc)
//	POST /debug/sim/clear-faults?uuid=        ends the GPU's faults, as a GPU reset would
//	POST /debug/sim/recover?uuid=             operator recovery of one GPU (asks NVML first)
//
// The routes are served from the start, before NVML is open: until the
// simulated node is open (xid, fault, clear-faults) or its GPUs are
// published and their health tracked (recover) they answer 503 saying so.
// Then a bad request is 400, what the simulated NVML refuses (a GPU it does
// not know, no health watch yet) 409, recover of a GPU the tracker does not
// know 404 and of one NVML does not vouch for 409. A node on real NVML has
// no Seam and none of these routes (404).
package simdebug

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// Seam is the simulation's side of one GPU node: it opens the simulated
// NVML and keeps the simulated node, learns the node's health tracker once
// the GPUs are published, and serves the fault routes over both. The late
// binding is the seam's own: the node hands it what it opens and
// publishes, and holds nothing of the simulation itself.
type Seam struct {
	node    atomic.Pointer[sim.Node]
	tracker atomic.Pointer[health.Tracker]
}

// New returns a seam with nothing open yet: every route answers 503.
func New() *Seam { return &Seam{} }

// Open opens the simulated NVML the --nvml value names (the node's
// OpenFunc under --nvml=sim:...) and keeps the simulated node for the
// routes.
func (s *Seam) Open(nvml string, o backend.Options) (*backend.Backend, error) {
	b, node, err := backend.OpenSimulated(nvml, o)
	if err != nil {
		return nil, err
	}
	s.node.Store(node)
	return b, nil
}

// Track is told the node's health tracker once the GPUs are published:
// from then on recover works.
func (s *Seam) Track(t *health.Tracker) { s.tracker.Store(t) }

// Routes returns the patterns and handlers to serve on the metrics address.
func (s *Seam) Routes() map[string]http.Handler {
	return routes(func() (injector, error) {
		if n := s.node.Load(); n != nil {
			return n, nil
		}
		return nil, errors.New("SIMULATION: the simulated node is not open yet; /readyz says why")
	}, func() (recoverer, error) {
		if t := s.tracker.Load(); t != nil {
			return t, nil
		}
		return nil, errors.New("SIMULATION: health tracking has not started yet (the GPUs are not published); /readyz says why")
	})
}

// injector delivers simulated Xids and faults through the simulated NVML
// (*sim.Node).
type injector interface {
	InjectXid(uuid string, xid uint64) error
	InjectFault(uuid string, f sim.Fault) error
	ClearFaults(uuid string) error
}

// recoverer clears a GPU's Unhealthy mark (the operator action) if NVML
// vouches for it (*health.Tracker).
type recoverer interface {
	Recover(ctx context.Context, uuid string) error
}

// routes are the handlers over the simulated node and the tracker, each
// looked up per request: an error there (not there yet) is 503.
func routes(node func() (injector, error), tracker func() (recoverer, error)) map[string]http.Handler {
	inject := func(w http.ResponseWriter, do func(injector) error) bool {
		inj, err := node()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return false
		}
		if err := do(inj); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return false
		}
		return true
	}
	return map[string]http.Handler{
		"POST /debug/sim/xid": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			xid, err := strconv.ParseUint(r.URL.Query().Get("xid"), 10, 64)
			if uuid == "" || err != nil {
				http.Error(w, "give uuid=<GPU UUID> and xid=<number>", http.StatusBadRequest)
				return
			}
			if inject(w, func(inj injector) error { return inj.InjectXid(uuid, xid) }) {
				_, _ = fmt.Fprintf(w, "SIMULATED Xid %d injected on %s\n", xid, uuid)
			}
		}),
		"POST /debug/sim/fault": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			f, err := sim.ParseFault(r.URL.Query().Get("fault"))
			if uuid == "" || err != nil {
				http.Error(w, fmt.Sprintf("give uuid=<GPU UUID> and fault=<name>: %v", err), http.StatusBadRequest)
				return
			}
			if inject(w, func(inj injector) error { return inj.InjectFault(uuid, f) }) {
				_, _ = fmt.Fprintf(w, "SIMULATED fault %s set on %s\n", f, uuid)
			}
		}),
		"POST /debug/sim/clear-faults": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			if uuid == "" {
				http.Error(w, "give uuid=<GPU UUID>", http.StatusBadRequest)
				return
			}
			if inject(w, func(inj injector) error { return inj.ClearFaults(uuid) }) {
				_, _ = fmt.Fprintf(w, "SIMULATED faults of %s cleared\n", uuid)
			}
		}),
		"POST /debug/sim/recover": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			uuid := r.URL.Query().Get("uuid")
			if uuid == "" {
				http.Error(w, "give uuid=<GPU UUID>", http.StatusBadRequest)
				return
			}
			rec, err := tracker()
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
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
