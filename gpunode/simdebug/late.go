package simdebug

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// Late is the Injector and Recoverer of a daemon whose simulated node and
// health tracker are opened after its web server starts: until they are
// stored, each call says what is not there yet.
type Late struct {
	Node    *atomic.Pointer[backend.Backend]
	Tracker *atomic.Pointer[health.Tracker]
}

func (l Late) sim() (*sim.Node, error) {
	b := l.Node.Load()
	if b == nil || b.Sim == nil {
		return nil, errors.New("the simulated node is not open yet")
	}
	return b.Sim, nil
}

// InjectXid delivers an Xid through the simulated NVML event set.
func (l Late) InjectXid(uuid string, xid uint64) error {
	n, err := l.sim()
	if err != nil {
		return err
	}
	return n.InjectXid(uuid, xid)
}

// InjectFault sets an NVML health fault on the GPU.
func (l Late) InjectFault(uuid string, f sim.Fault) error {
	n, err := l.sim()
	if err != nil {
		return err
	}
	return n.InjectFault(uuid, f)
}

// ClearFaults ends the GPU's faults.
func (l Late) ClearFaults(uuid string) error {
	n, err := l.sim()
	if err != nil {
		return err
	}
	return n.ClearFaults(uuid)
}

// Recover is the operator's recovery of one GPU, if NVML vouches for it.
func (l Late) Recover(ctx context.Context, uuid string) error {
	t := l.Tracker.Load()
	if t == nil {
		return errors.New("health tracking has not started yet")
	}
	return t.Recover(ctx, uuid)
}
