package backend_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// Two backends opened from one driver root share the SIMULATED MIG layout:
// the one a daemon watches (MIGLayout, every --mig-rescan-interval) changes
// once the other writes the state file, so the daemon republishes the same
// MIG devices the writer made.
func TestSimulatedMIGLayoutFollowsTheDriverRoot(t *testing.T) {
	const value = "sim:a100-80gb*2,mig=1:7g.80gb"
	root := t.TempDir()
	ctx := context.Background()
	daemon, _, err := backend.OpenSimulated(value, backend.Options{DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	defer daemon.Close()
	before, err := daemon.MIGLayout(ctx)
	if err != nil {
		t.Fatal(err)
	}

	_, changer, err := backend.OpenSimulated(value, backend.Options{DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := changer.DestroyGPUInstance(1, 0); err != nil {
		t.Fatal(err)
	}
	var want []string
	for range 2 {
		gi, ci, err := changer.CreateGPUInstance(1, "3g.40gb")
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, sim.MIGUUID(sim.UUID("a100-80gb", 1), gi, ci))
	}
	if _, err := changer.SaveState(); err != nil {
		t.Fatal(err)
	}

	after, err := daemon.MIGLayout(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after == before {
		t.Fatalf("MIGLayout did not change after the state file did: %q", after)
	}
	node, err := daemon.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range node.Devices[1].MIG {
		got = append(got, m.UUID)
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the daemon discovers %v, want the writer's %v", got, want)
	}
	if again, _ := daemon.MIGLayout(ctx); again != after {
		t.Errorf("MIGLayout changed again with the file unchanged: %q, then %q", after, again)
	}
}
