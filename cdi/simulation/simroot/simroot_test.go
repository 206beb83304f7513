package simroot_test

import (
	"path/filepath"
	"testing"

	"github.com/nvinject/nvinject/cdi/driver"
	"github.com/nvinject/nvinject/cdi/simulation/simfacts"
	"github.com/nvinject/nvinject/cdi/simulation/simtest"
)

// The facts carry each MIG GPU's MIG devices as discovered, so the
// simulated nvidia-smi can list those a container was given.
func TestFactsListMIGDevices(t *testing.T) {
	dir := t.TempDir()
	node := simtest.DriverRoot(t, "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb", dir)
	f, err := simfacts.Read(filepath.Join(dir, "driver-root", driver.SimulatedFacts))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.GPUs) != 2 || f.GPUs[0].MIG || len(f.GPUs[0].MIGDevices) != 0 || !f.GPUs[1].MIG {
		t.Fatalf("GPUs %+v", f.GPUs)
	}
	want := node.Devices[1].MIG
	got := f.GPUs[1].MIGDevices
	if len(got) != len(want) || len(got) != 2 {
		t.Fatalf("MIG devices %+v, want %d", got, len(want))
	}
	for i, m := range want {
		w := simfacts.MIGDevice{UUID: m.UUID, Profile: m.Profile, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance,
			CIAccessMinor: int(m.CIAccess.Minor), MemoryMiB: m.MemoryBytes >> 20}
		if got[i] != w || w.CIAccessMinor == 0 || w.MemoryMiB == 0 {
			t.Errorf("MIG device %d = %+v, want %+v", i, got[i], w)
		}
	}
}
