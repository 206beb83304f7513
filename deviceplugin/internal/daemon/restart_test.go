package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// openWithFault opens the simulated node with fault f already on GPU i,
// as a node that comes up with a bad GPU.
func (r *rig) openWithFault(i int, f sim.Fault) Option {
	return WithNode(gpunode.WithOpen(func(v string, o backend.Options) (*backend.Backend, error) {
		b, node, err := backend.OpenSimulated(v, o)
		if err != nil {
			return nil, err
		}
		r.sim = node
		return b, node.InjectFault(simUUID(i), f)
	}))
}

// The plugin registers only once health monitoring runs, so kubelet's very
// first list is already the truth: Healthy GPUs Healthy, a GPU NVML does
// not vouch for Unhealthy. No all-Unhealthy start window.
func TestFirstListIsTheTruth(t *testing.T) {
	r := start(t, "sim:a100-80gb*2")
	if h := healthOf(r.watch(t)()); h[simUUID(0)] != pluginapi.Healthy || h[simUUID(1)] != pluginapi.Healthy {
		t.Fatalf("first list = %v; want every GPU Healthy", h)
	}
	r.stop()
	r.run(t, r.openWithFault(1, sim.FaultRowRemapFailure))
	if h := healthOf(r.watch(t)()); h[simUUID(0)] != pluginapi.Healthy || h[simUUID(1)] != pluginapi.Unhealthy {
		t.Fatalf("first list with GPU 1's row remapping failed = %v; want only GPU 1 Unhealthy", h)
	}
}

// A GPU that fell off the bus (Xid 79) stays Unhealthy across plugin
// restarts, through the checkpoint in --state-dir; operator recovery
// turns it Healthy only when NVML vouches for it.
func TestXid79StaysUnhealthyAcrossRestarts(t *testing.T) {
	r := start(t, "sim:a100-80gb*2", "--health-quiet-period=1ms")
	next := r.watch(t)
	untilHealth(t, next, simUUID(0), pluginapi.Healthy)
	if err := r.sim.InjectXid(simUUID(0), 79); err != nil {
		t.Fatal(err)
	}
	untilHealth(t, next, simUUID(0), pluginapi.Unhealthy)
	for restart := range 2 {
		r.stop()
		r.run(t)
		h := healthOf(r.watch(t)())
		if h[simUUID(0)] != pluginapi.Unhealthy || h[simUUID(1)] != pluginapi.Healthy {
			t.Fatalf("first list after restart %d = %v; want GPU 0 still Unhealthy", restart+1, h)
		}
	}
	rec := r.tracker.Load()
	if err := r.sim.InjectFault(simUUID(0), sim.FaultLost); err != nil {
		t.Fatal(err)
	}
	if err := rec.Recover(context.Background(), simUUID(0)); err == nil || !strings.Contains(err.Error(), "does not answer") {
		t.Fatalf("Recover of a GPU NVML cannot reach = %v; want a refusal", err)
	}
	if err := r.sim.ClearFaults(simUUID(0)); err != nil {
		t.Fatal(err)
	}
	next = r.watch(t)
	if err := rec.Recover(context.Background(), simUUID(0)); err != nil {
		t.Fatal(err)
	}
	untilHealth(t, next, simUUID(0), pluginapi.Healthy)
	r.stop()
	r.run(t)
	if h := healthOf(r.watch(t)()); h[simUUID(0)] != pluginapi.Healthy {
		t.Fatalf("first list after recovery and restart = %v; want GPU 0 Healthy", h)
	}
}

// After the quiet period the GPU turns Healthy only once NVML vouches for
// it again.
func TestQuietPeriodWaitsForNVML(t *testing.T) {
	r := start(t, "sim:a100-80gb", "--health-quiet-period=20ms")
	next := r.watch(t)
	untilHealth(t, next, simUUID(0), pluginapi.Healthy)
	if err := r.sim.InjectFault(simUUID(0), sim.FaultRetiredPagesPending); err != nil {
		t.Fatal(err)
	}
	if err := r.sim.InjectXid(simUUID(0), 48); err != nil {
		t.Fatal(err)
	}
	untilHealth(t, next, simUUID(0), pluginapi.Unhealthy)
	time.Sleep(150 * time.Millisecond) // several quiet periods
	st := r.tracker.Load().States()
	if st[0].Healthy || !strings.Contains(st[0].Reason, "retired pages are pending") {
		t.Fatalf("after the quiet period with pages pending: %+v; want Unhealthy, saying why", st)
	}
	if err := r.sim.ClearFaults(simUUID(0)); err != nil {
		t.Fatal(err)
	}
	untilHealth(t, next, simUUID(0), pluginapi.Healthy)
}
