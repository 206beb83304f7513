package sim_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

const stateSpec = "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb"

// followingNode is a simulated node of stateSpec following file, as a
// daemon opens it, with the MIG devices its discovery finds.
func followingNode(t *testing.T, file string) (*sim.Node, func() []string) {
	t.Helper()
	spec, err := sim.ParseSpec(stateSpec)
	if err != nil {
		t.Fatal(err)
	}
	n := sim.New(spec, sim.WithStateFile(file))
	inv, err := nvmlinv.New(n.NVML(), nvmlinv.WithNodeLookup(n.Nodes()), nvmlinv.WithCaps(n.ProcFS(), "the SIMULATED driver's procfs"), nvmlinv.WithSimulated())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inv.Close() })
	return n, func() []string {
		t.Helper()
		node, err := inv.Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range node.Devices {
			for _, m := range d.MIG {
				out = append(out, fmt.Sprintf("%d %d/%d %s %s", d.Index, m.GPUInstance, m.ComputeInstance, m.Profile, m.UUID))
			}
		}
		return out
	}
}

// Two processes opening one spec and one state file see the layout one of
// them changed, with the same MIG UUIDs, and so does one started after.
func TestNodesFollowTheStateFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), sim.StateFile)
	changer, _ := followingNode(t, file)
	_, a := followingNode(t, file)
	_, b := followingNode(t, file)
	before := a()
	if len(before) != 2 || !reflect.DeepEqual(before, b()) {
		t.Fatalf("before any change the nodes differ or lack the spec's layout: %v, %v", before, b())
	}

	if err := changer.Follow(); err != nil {
		t.Fatal(err)
	}
	if err := changer.DestroyGPUInstance(1, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := changer.CreateGPUInstance(1, "2g.20gb"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := changer.CreateGPUInstance(1, "1g.10gb"); err != nil {
		t.Fatal(err)
	}
	st, err := changer.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	if st.Generation != 1 {
		t.Errorf("first write's generation = %d, want 1", st.Generation)
	}

	after := a()
	spec, _ := sim.ParseSpec(stateSpec)
	parent := sim.UUID(spec.Model, 1)
	want := []string{
		"1 0/0 2g.20gb " + sim.MIGUUID(parent, 0, 0),
		"1 1/0 1g.10gb " + sim.MIGUUID(parent, 1, 0),
		"1 2/0 1g.10gb " + sim.MIGUUID(parent, 2, 0),
	}
	if !reflect.DeepEqual(after, want) {
		t.Fatalf("node a after the change:\n got %v\nwant %v", after, want)
	}
	if got := b(); !reflect.DeepEqual(got, want) {
		t.Errorf("node b after the change: %v, want %v", got, want)
	}
	_, fresh := followingNode(t, file)
	if got := fresh(); !reflect.DeepEqual(got, want) {
		t.Errorf("a node started after the change: %v, want %v", got, want)
	}

	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if got := a(); !reflect.DeepEqual(got, before) {
		t.Errorf("with the file removed: %v, want the spec's layout %v", got, before)
	}
}

// Recorded IDs are given as recorded, not as the lowest free: a node
// reproduces the UUIDs of a layout made by destroys and creates.
func TestStateFilePinsIDs(t *testing.T) {
	file := filepath.Join(t.TempDir(), "simulated-mig.json")
	writeState(t, file, `{"gpuInstances": [
		{"id": 5, "profile": "3g.40gb", "placement": {"start": 4, "size": 4}, "computeInstances": [{"id": 2, "profile": "1c.3g.40gb"}]}]}`)
	_, discover := followingNode(t, file)
	spec, _ := sim.ParseSpec(stateSpec)
	want := []string{"1 5/2 1c.3g.40gb " + sim.MIGUUID(sim.UUID(spec.Model, 1), 5, 2)}
	if got := discover(); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// A file that cannot be followed changes nothing, is reported once with
// the file and the fix, and a good file after it is followed.
func TestBadStateFileKeepsTheLayout(t *testing.T) {
	gi := func(id int, profile string, start, size int) string {
		return fmt.Sprintf(`{"id": %d, "profile": %q, "placement": {"start": %d, "size": %d}, "computeInstances": [{"id": 0, "profile": %q}]}`, id, profile, start, size, profile)
	}
	for _, tc := range []struct {
		name, body, want string
	}{
		{"not JSON", "{", "not a simulated MIG state"},
		{"an unknown field", `{"spec": "` + stateSpec + `", "gpus": [], "color": 1}`, "unknown field"},
		{"another model", `{"spec": "sim:h100-80gb*2,mig=1", "gpus": []}`, "it is for h100-80gb*2"},
		{"an unknown profile", gpuState(1, gi(0, "5g.50gb", 0, 4)), `"5g.50gb" is not a GPU instance profile`},
		{"overlapping instances", gpuState(1, gi(0, "3g.40gb", 0, 4)+","+gi(1, "2g.20gb", 2, 2)), "overlaps"},
		{"a placement the profile lacks", gpuState(1, gi(0, "3g.40gb", 1, 4)), "is not one of the profile's (0+4, 4+4)"},
		{"a repeated ID", gpuState(1, gi(0, "1g.10gb", 0, 1)+","+gi(0, "1g.10gb", 1, 1)), "GPU instance ID 0 is repeated"},
		{"a GPU with MIG mode off", gpuState(0, gi(0, "1g.10gb", 0, 1)), "MIG mode off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "simulated-mig.json")
			n, discover := followingNode(t, file)
			before := discover()
			if err := os.WriteFile(file, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			err := n.Follow()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "remove it") {
				t.Fatalf("Follow() = %v, want an error naming %s, saying %q and the fix", err, file, tc.want)
			}
			if got := discover(); !reflect.DeepEqual(got, before) {
				t.Errorf("layout after the bad file: %v, want it kept: %v", got, before)
			}
			if err := n.Follow(); err != nil {
				t.Errorf("the unchanged bad file is reported again: %v", err)
			}
			writeState(t, file, `{"gpuInstances": [`+gi(3, "7g.80gb", 0, 8)+`]}`)
			if got := discover(); len(got) != 1 || !strings.HasPrefix(got[0], "1 3/0 7g.80gb") {
				t.Errorf("a good file after the bad one: %v", got)
			}
		})
	}
}

func gpuState(index int, gis string) string {
	return fmt.Sprintf(`{"spec": %q, "generation": 1, "gpus": [{"index": %d, "gpuInstances": [%s]}]}`, stateSpec, index, gis)
}

// writeState writes a state file of stateSpec with GPU 1's entry gpu1.
func writeState(t *testing.T, file, gpu1 string) {
	t.Helper()
	body := fmt.Sprintf(`{"spec": %q, "generation": 7, "gpus": [%s]}`, stateSpec, strings.Replace(gpu1, "{", `{"index": 1, `, 1))
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file+".tmp", []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(file+".tmp", file); err != nil {
		t.Fatal(err)
	}
}
