// Package devices is the plugin's resource table: the published units (a
// whole GPU or a MIG device, each possibly shared as replicas) with the IDs
// kubelet sees, their CDI names and NUMA/NVLink topology, all fixed at
// start so Allocate and GetPreferredAllocation never touch NVML.
package devices

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/sharing"
)

// IDFunc gives the device ID kubelet sees for a unit.
type IDFunc func(gpuselect.Unit) string

// ByUUID names devices by their UUID, GPU- or MIG- (DEVICE_ID_STRATEGY=uuid).
func ByUUID(u gpuselect.Unit) string { return u.UUID() }

// ByIndex names whole GPUs by NVML index and MIG devices NVIDIA's way,
// "<gpu index>:<MIG index>" (DEVICE_ID_STRATEGY=index).
func ByIndex(u gpuselect.Unit) string {
	if u.MIG == nil {
		return strconv.Itoa(u.GPU.Index)
	}
	i := slices.IndexFunc(u.GPU.MIG, func(m gpu.MIGDevice) bool { return m.UUID == u.MIG.UUID })
	return contract.MIGDeviceIndexID(u.GPU.Index, i)
}

// Entry is one published device: a unit, or one replica of a shared one.
type Entry struct {
	ID string
	// Device is the whole GPU, or the MIG device's parent: its health and
	// topology are the entry's.
	Device gpu.Device
	// MIG is the MIG device; nil for a whole GPU.
	MIG *gpu.MIGDevice
	// UUID is the unit's own: the GPU's or the MIG device's.
	UUID    string
	CDIName string
}

// Table holds the published devices in publication order.
type Table struct {
	entries []Entry
	byID    map[string]int
	score   [][]int
	// replicas is how many IDs each unit has (1: not shared).
	replicas int
}

// Option configures a Table.
type Option func(*Table)

// WithReplicas publishes every unit as n replicas, IDs "<id>::<i>"
// (time-slicing): n pods may hold it at once.
func WithReplicas(n int) Option { return func(t *Table) { t.replicas = n } }

// New builds the table for units, which must be on node. cdiName gives
// the qualified CDI name of a GPU or MIG UUID.
func New(node gpu.Node, units []gpuselect.Unit, id IDFunc, cdiName func(uuid string) string, opts ...Option) (*Table, error) {
	t := &Table{byID: map[string]int{}, replicas: 1}
	for _, o := range opts {
		o(t)
	}
	for _, u := range units {
		if _, ok := node.Device(u.GPU.UUID); !ok {
			return nil, fmt.Errorf("GPU %s is not on this node", u.GPU.UUID)
		}
		base := id(u)
		for r := range t.replicas {
			e := Entry{ID: base, Device: u.GPU, MIG: u.MIG, UUID: u.UUID(), CDIName: cdiName(u.UUID())}
			if t.replicas > 1 {
				e.ID = sharing.ReplicaID(base, r)
			}
			if _, dup := t.byID[e.ID]; dup {
				return nil, fmt.Errorf("two devices have device ID %q; use DEVICE_ID_STRATEGY=uuid", e.ID)
			}
			t.byID[e.ID] = len(t.entries)
			t.entries = append(t.entries, e)
		}
	}
	t.score = make([][]int, len(t.entries))
	for i, a := range t.entries {
		t.score[i] = make([]int, len(t.entries))
		for j, b := range t.entries {
			if i != j {
				t.score[i][j] = pairScore(a, b, node.Link(a.Device.UUID, b.Device.UUID))
			}
		}
	}
	return t, nil
}

// pairScore rates how well two devices work together: two replicas of one
// GPU are not two GPUs, so never; MIG devices of one parent pack the
// fewest GPUs; then NVLink, a closer PCIe common ancestor, the same NUMA
// node.
func pairScore(a, b Entry, l gpu.Link) int {
	if a.UUID == b.UUID {
		return -1000
	}
	s := 0
	if a.Device.UUID == b.Device.UUID {
		s += 200
	}
	if l.NVLink {
		s += 100
	}
	if l.Level > 0 && l.Level < 60 {
		s += 60 - l.Level
	}
	if a.Device.NUMANode >= 0 && a.Device.NUMANode == b.Device.NUMANode {
		s += 10
	}
	return s
}

// Entries returns the published devices in order.
func (t *Table) Entries() []Entry { return t.entries }

// Replicas is how many IDs each unit has (1: not shared).
func (t *Table) Replicas() int { return t.replicas }

// Lookup finds a published device by ID.
func (t *Table) Lookup(id string) (Entry, bool) {
	i, ok := t.byID[id]
	if !ok {
		return Entry{}, false
	}
	return t.entries[i], true
}
