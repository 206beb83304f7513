package driver

import (
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// counterSets are the KEP-4815 counter sets of the selected GPUs, one per
// GPU (contract.DRACounterSetName): its memory in bytes and, on a GPU with
// MIG mode on, one counter of 1 per memory slice its GPU instances occupy;
// with share devices, a GPU without MIG has the share counter instead
// (shareCounters). nil when no GPU has MIG on and no share device is
// published: a pool of whole GPUs only has nothing to partition, and stays
// publishable where DRAPartitionableDevices is off.
func counterSets(selected []gpu.Device, shares bool, slots map[string][]Device) []resourceapi.CounterSet {
	var out []resourceapi.CounterSet
	mig := shares
	for _, g := range selected {
		mig = mig || g.MIGEnabled
		c := gpuCounters(g)
		for _, s := range slots[g.UUID] {
			for i := s.Slot.Placement.Start; i < s.Slot.Placement.Start+s.Slot.Placement.Size; i++ {
				c[memorySlice(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
			}
		}
		if shares && !g.MIGEnabled {
			c = shareCounters(2)
		}
		out = append(out, resourceapi.CounterSet{Name: contract.DRACounterSetName(g.Index), Counters: c})
	}
	if !mig {
		return nil
	}
	return out
}

func gpuCounters(g gpu.Device) map[string]resourceapi.Counter {
	c := map[string]resourceapi.Counter{contract.DRACounterMemory: {Value: bytesQuantity(g.MemoryBytes)}}
	for _, m := range g.MIG {
		for i := m.Placement.Start; i < m.Placement.Start+m.Placement.Size; i++ {
			c[memorySlice(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
		}
	}
	return c
}

// consumes is what allocating dev takes from its GPU's counter set: all of
// it for a whole GPU (with share devices: see shareCounters); for a MIG device its memory and the memory slices of
// its placement. Compute instances that share a GPU instance (1c.3g.40gb)
// share its slices: each takes its compute slices' share, rounded down, so
// they fit beside each other and any of them keeps the slices from another
// GPU instance or the whole GPU. nil when the pool has no counters.
func (d *Driver) consumes(dev Device) []resourceapi.DeviceCounterConsumption {
	if d.counters == nil {
		return nil
	}
	c := gpuCounters(dev.Device)
	switch {
	case dev.Share:
		c = shareCounters(2)
	case d.shares && !dev.MIGEnabled:
		c = shareCounters(1)
	}
	if s := dev.Slot; s != nil {
		c = map[string]resourceapi.Counter{contract.DRACounterMemory: {Value: bytesQuantity(s.MemoryBytes)}}
		for i := s.Placement.Start; i < s.Placement.Start+s.Placement.Size; i++ {
			c[memorySlice(i)] = resourceapi.Counter{Value: *resource.NewQuantity(1, resource.DecimalSI)}
		}
	}
	if m := dev.MIG; m != nil {
		num, den := uint64(m.ComputeSlices), uint64(m.GPUSlices)
		if num == 0 || num > den {
			num, den = 1, 1
		}
		c = map[string]resourceapi.Counter{contract.DRACounterMemory: {Value: bytesQuantity(m.MemoryBytes * num / den)}}
		share := *resource.NewMilliQuantity(int64(1000*num/den), resource.DecimalSI)
		for i := m.Placement.Start; i < m.Placement.Start+m.Placement.Size; i++ {
			c[memorySlice(i)] = resourceapi.Counter{Value: share}
		}
	}
	return []resourceapi.DeviceCounterConsumption{{CounterSet: contract.DRACounterSetName(dev.Index), Counters: c}}
}

// shareCounters is a GPU's counter contract.DRACounterShare at n. The GPU
// counts 2, its whole device consumes 1 and its share device 2, which the
// allocator charges once however many shares it hands out: whole and
// shares never fit together (3), a second share costs nothing, and an
// admin-access claim on the whole device of a GPU held whole fits (2):
// Kubernetes 1.37's allocator charges an admin-access allocation's
// counters too (kubernetes/kubernetes#140729).
func shareCounters(n int64) map[string]resourceapi.Counter {
	return map[string]resourceapi.Counter{contract.DRACounterShare: {Value: *resource.NewQuantity(n, resource.DecimalSI)}}
}

func memorySlice(i int) string { return contract.DRACounterMemorySlice + strconv.Itoa(i) }

func bytesQuantity(b uint64) resource.Quantity {
	return *resource.NewQuantity(int64(b), resource.BinarySI)
}
