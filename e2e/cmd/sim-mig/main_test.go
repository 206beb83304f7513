package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

func TestParse(t *testing.T) {
	global := []string{"--driver-root=/r", "--nvml=sim:a100-80gb*2,mig=1"}
	for _, tc := range []struct {
		name    string
		args    []string
		want    op
		wantErr string
	}{
		{"create with full CIs", []string{"mig", "-cgi", "1g.10gb,1g.10gb", "-C", "-i", "1"}, op{gpu: 1, create: []string{"1g.10gb", "1g.10gb"}}, ""},
		{"options in any order", []string{"mig", "-i", "1", "-C", "-cgi", "3g.40gb"}, op{gpu: 1, create: []string{"3g.40gb"}}, ""},
		{"destroy all", []string{"mig", "-dci", "-dgi", "-i", "1"}, op{gpu: 1, destroy: true}, ""},
		{"destroy some", []string{"mig", "-dci", "-dgi", "-i", "0", "-gi", "1,2"}, op{gpu: 0, destroy: true, gis: []int{1, 2}}, ""},
		{"create without -C", []string{"mig", "-cgi", "1g.10gb", "-i", "1"}, op{}, "add -C"},
		{"no GPU", []string{"mig", "-cgi", "1g.10gb", "-C"}, op{}, "give the GPU with -i"},
		{"two GPUs", []string{"mig", "-dci", "-dgi", "-i", "0,1"}, op{}, "give one GPU index"},
		{"-dgi alone", []string{"mig", "-dgi", "-i", "1"}, op{}, "give -dci -dgi"},
		{"create and destroy", []string{"mig", "-cgi", "1g.10gb", "-C", "-dci", "-dgi", "-i", "1"}, op{}, "two commands"},
		{"-gi with -cgi", []string{"mig", "-cgi", "1g.10gb", "-C", "-gi", "1", "-i", "1"}, op{}, "-cgi takes none"},
		{"a missing value", []string{"mig", "-cgi", "-C", "-i", "1"}, op{}, "-cgi needs a value"},
		{"an empty profile", []string{"mig", "-cgi", "1g.10gb,", "-C", "-i", "1"}, op{}, "empty profile"},
		{"a bad -gi", []string{"mig", "-dci", "-dgi", "-i", "1", "-gi", "x"}, op{}, "GPU instance IDs"},
		{"an option outside the subset", []string{"mig", "-lgi"}, op{}, `"-lgi" is not in the simulation's subset`},
		{"nothing to do", []string{"mig", "-i", "1"}, op{}, "give -cgi"},
		{"another command", []string{"topo"}, op{}, "the command is mig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parse(append(global, tc.args...), io.Discard, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parse(%v) = %v, want an error saying %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.op, tc.want) {
				t.Errorf("parse(%v) = %+v, want %+v", tc.args, c.op, tc.want)
			}
		})
	}
	if _, err := parse([]string{"mig", "-dci", "-dgi", "-i", "1"}, io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "--driver-root") {
		t.Errorf("without --driver-root and --nvml: %v", err)
	}
}

const value = "sim:a100-80gb*2,mig=1:3g.40gb+3g.40gb"

// simMIG runs the command over root, its devices under dev and holders under proc.
func simMIG(t *testing.T, root, dev, proc string, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"--driver-root=" + root, "--nvml=" + value, "--dev-root=" + dev,
		"--record=" + filepath.Join(dev, "record"), "--proc-root=" + proc}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

// daemonSees is what a daemon's simulated NVML over root discovers on GPU 1.
func daemonSees(t *testing.T, root string) []gpu.MIGDevice {
	t.Helper()
	b, err := backend.Open(value, backend.Options{DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	node, err := b.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return node.Devices[1].MIG
}

// The operator's change reaches the daemons with the UUIDs it printed, the
// host gets the new instances' caps nodes, recorded, and an instance a
// process holds is refused as nvidia-smi refuses it.
func TestChangeTheLayout(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating the caps nodes (mknod) needs root")
	}
	root, dev, proc := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.Mkdir(filepath.Join(dev, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := simMIG(t, root, dev, proc, "mig", "-dci", "-dgi", "-i", "1", "-gi", "1"); code != 0 {
		t.Fatalf("destroy GI 1: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code := simMIG(t, root, dev, proc, "mig", "-cgi", "1g.10gb,1g.10gb", "-C", "-i", "1")
	if code != 0 {
		t.Fatalf("create: exit %d\n%s%s", code, out, errOut)
	}
	parent := sim.UUID("a100-80gb", 1)
	for _, want := range []string{
		"Successfully created GPU instance ID  1 on GPU  1 using profile MIG 1g.10gb",
		"Successfully created compute instance ID  0 on GPU  1 GPU instance ID  2 using profile MIG 1g.10gb",
		"MIG device " + sim.MIGUUID(parent, 1, 0), "MIG device " + sim.MIGUUID(parent, 2, 0),
		"wrote generation 2 of the simulated MIG state " + filepath.Join(root, sim.StateFile),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	migs := daemonSees(t, root)
	var got []string
	for _, m := range migs {
		got = append(got, m.UUID)
		if _, err := os.Stat(filepath.Join(dev, m.CIAccess.Path)); err != nil {
			t.Errorf("the host lacks %s's caps node: %v", m.UUID, err)
		}
	}
	if want := []string{sim.MIGUUID(parent, 0, 0), sim.MIGUUID(parent, 1, 0), sim.MIGUUID(parent, 2, 0)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("a daemon sees %v, want %v", got, want)
	}
	record, err := os.ReadFile(filepath.Join(dev, "record"))
	if err != nil || !strings.Contains(string(record), filepath.Join(dev, migs[2].CIAccess.Path)) {
		t.Errorf("the record %q (%v) lacks %s", record, err, migs[2].CIAccess.Path)
	}

	// A process holds GI 2's compute instance.
	fd := filepath.Join(proc, "4242", "fd", "7")
	if err := os.MkdirAll(filepath.Dir(fd), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dev, migs[2].CIAccess.Path), fd); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = simMIG(t, root, dev, proc, "mig", "-dci", "-dgi", "-i", "1", "-gi", "2")
	if code != 1 || !strings.Contains(errOut, "Unable to destroy GPU instance ID  2 from GPU  1: In use by another client") {
		t.Fatalf("destroying the held instance: exit %d, want 1 and nvidia-smi's refusal\n%s%s", code, out, errOut)
	}
	if after := daemonSees(t, root); len(after) != 3 {
		t.Errorf("after the refusal a daemon sees %d MIG devices, want the 3 kept", len(after))
	}
}
