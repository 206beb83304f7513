package gpunode

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

const migSpec = "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb"

// relayoutRig runs a Node over migSpec whose serve hands each round's GPUs
// to the test, and keeps the simulated node to change its layout.
type relayoutRig struct {
	n      *Node
	sim    atomic.Pointer[sim.Node]
	rounds chan GPUs
	cfgDir string
}

func startRelayout(t *testing.T, args ...string) *relayoutRig {
	t.Helper()
	r := &relayoutRig{rounds: make(chan GPUs, 8)}
	open := func(v string, o backend.Options) (*backend.Backend, error) {
		b, node, err := backend.OpenSimulated(v, o)
		r.sim.Store(node)
		return b, err
	}
	cfg := config(t, append([]string{"--nvml=" + migSpec, "--mig-rescan-interval=10ms"}, args...)...)
	r.cfgDir = cfg.CDISpecDir
	r.n = New(cfg, quietLog(), WithOpen(open), WithRepublishMetric("test_republishes_total"))
	run(t, r.n, func(ctx context.Context, g GPUs) error {
		r.rounds <- g
		<-ctx.Done()
		return nil
	})
	return r
}

// next is the next round's GPUs.
func (r *relayoutRig) next(t *testing.T, within time.Duration) (GPUs, bool) {
	t.Helper()
	select {
	case g := <-r.rounds:
		return g, true
	case <-time.After(within):
		return GPUs{}, false
	}
}

// migUUIDs are g's MIG devices, as UUID and profile.
func migUUIDs(g GPUs) []string {
	var out []string
	for _, d := range g.Published {
		for _, m := range d.MIG {
			out = append(out, m.UUID+" "+m.Profile)
		}
	}
	return out
}

// A layout changed under a running Node is published by a new round in
// the same process: the new MIG device in the GPUs and the CDI spec, the
// destroyed one gone from both, and an untouched GPU's Xid mark kept.
func TestLayoutChangeIsRepublished(t *testing.T) {
	r := startRelayout(t, "--mig-strategy=mixed")
	first, ok := r.next(t, 10*time.Second)
	if !ok {
		t.Fatal("the protocol never started")
	}
	gpu1 := sim.UUID("a100-80gb", 1)
	var small, big string
	smallGI := -1
	for _, m := range first.Published[1].MIG {
		switch m.Profile {
		case "1g.10gb":
			small, smallGI = m.UUID+" "+m.Profile, m.GPUInstance
		case "3g.40gb":
			big = m.UUID + " " + m.Profile
		}
	}
	if small == "" || big == "" {
		t.Fatalf("first round's MIG devices %v, want a 3g.40gb and a 1g.10gb", migUUIDs(first))
	}
	<-first.Health.Monitored()
	if err := r.sim.Load().InjectXid(simUUID(0), 79); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); first.Health.Healthy(simUUID(0)); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("GPU 0 never turned Unhealthy")
		}
	}

	if err := r.sim.Load().DestroyGPUInstance(1, smallGI); err != nil {
		t.Fatal(err)
	}
	gi, ci, err := r.sim.Load().CreateGPUInstance(1, "2g.20gb")
	if err != nil {
		t.Fatal(err)
	}
	added := sim.MIGUUID(gpu1, gi, ci) + " 2g.20gb"
	var g GPUs
	for {
		var ok bool
		if g, ok = r.next(t, 10*time.Second); !ok {
			t.Fatalf("no round published the new layout; republishes %v", testutil.ToFloat64(r.n.republishes))
		}
		if slices.Contains(migUUIDs(g), added) {
			break
		}
	}
	if got := migUUIDs(g); slices.Contains(got, small) || !slices.Contains(got, big) {
		t.Errorf("MIG devices after the change %v: want %s gone, %s kept, %s added", got, small, big, added)
	}
	spec, err := os.ReadFile(filepath.Join(r.cfgDir, "nvidia.com-gpu.yaml"))
	if err != nil || !strings.Contains(string(spec), "name: "+sim.MIGUUID(gpu1, gi, ci)) || !strings.Contains(string(spec), "2g.20gb") || strings.Contains(string(spec), "1g.10gb") {
		t.Errorf("CDI spec (%v) does not hold the new layout: want the 2g.20gb MIG device %s, no 1g.10gb", err, added)
	}
	if g.Health.Healthy(simUUID(0)) {
		t.Error("GPU 0's Xid 79 was lost across the republish")
	}
	<-g.Health.Monitored()
	if !g.Health.Healthy(gpu1) {
		t.Errorf("GPU 1 after the republish: %+v, want Healthy", g.Health.States())
	}
	if n := testutil.ToFloat64(r.n.republishes); n < 1 {
		t.Errorf("republishes = %v, want at least 1", n)
	}
	if err := r.n.Ready(); err != nil {
		t.Errorf("Ready after the republish: %v", err)
	}
}

// Only the published set counts: a change on a GPU that is not published
// (MIG_STRATEGY=none leaves MIG GPUs out) starts no round.
func TestLayoutChangeOutsideThePublishedSetIsNoRepublish(t *testing.T) {
	r := startRelayout(t, "--mig-strategy=none")
	if _, ok := r.next(t, 10*time.Second); !ok {
		t.Fatal("the protocol never started")
	}
	if _, _, err := r.sim.Load().CreateGPUInstance(1, "1g.10gb"); err != nil {
		t.Fatal(err)
	}
	if g, ok := r.next(t, 300*time.Millisecond); ok {
		t.Fatalf("a round started for an unpublished GPU's layout: %v", g.UUIDs())
	}
	if n := testutil.ToFloat64(r.n.republishes); n != 0 {
		t.Errorf("republishes = %v, want 0", n)
	}
}
