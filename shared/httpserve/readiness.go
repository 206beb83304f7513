package httpserve

import (
	"errors"
	"sync/atomic"
)

// Readiness is a daemon's /readyz state: not ready with a reason until
// SetReady. Its zero value is ready; NewReadiness starts not ready.
type Readiness struct{ why atomic.Pointer[string] }

// NewReadiness returns a Readiness that is not ready for why.
func NewReadiness(why string) *Readiness {
	r := &Readiness{}
	r.SetNotReady(why)
	return r
}

// SetNotReady records why the daemon is not ready.
func (r *Readiness) SetNotReady(why string) { r.why.Store(&why) }

// SetReady marks the daemon ready.
func (r *Readiness) SetReady() { r.why.Store(nil) }

// Ready is nil when ready, else an error saying why not (for WithReady).
func (r *Readiness) Ready() error {
	if p := r.why.Load(); p != nil {
		return errors.New(*p)
	}
	return nil
}
