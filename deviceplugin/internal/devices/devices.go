// Package devices is the plugin's resource table: the published GPUs with
// the IDs kubelet sees, their CDI names and NUMA/NVLink topology, all fixed
// at start so Allocate and GetPreferredAllocation never touch NVML.
package devices

import (
	"fmt"
	"strconv"

	"github.com/nvinject/nvinject/shared/gpu"
)

// IDFunc gives the device ID kubelet sees for a GPU.
type IDFunc func(gpu.Device) string

// ByUUID names devices by GPU UUID (DEVICE_ID_STRATEGY=uuid).
func ByUUID(d gpu.Device) string { return d.UUID }

// ByIndex names devices by NVML index (DEVICE_ID_STRATEGY=index).
func ByIndex(d gpu.Device) string { return strconv.Itoa(d.Index) }

// Entry is one published GPU.
type Entry struct {
	ID      string
	Device  gpu.Device
	CDIName string
}

// Table holds the published GPUs in publication order.
type Table struct {
	entries []Entry
	byID    map[string]int
	score   [][]int
}

// New builds the table for published, which must be among node's GPUs.
// cdiName gives the qualified CDI name of a GPU UUID.
func New(node gpu.Node, published []gpu.Device, id IDFunc, cdiName func(uuid string) string) (*Table, error) {
	t := &Table{byID: map[string]int{}}
	for _, d := range published {
		if _, ok := node.Device(d.UUID); !ok {
			return nil, fmt.Errorf("GPU %s is not on this node", d.UUID)
		}
		e := Entry{ID: id(d), Device: d, CDIName: cdiName(d.UUID)}
		if _, dup := t.byID[e.ID]; dup {
			return nil, fmt.Errorf("two GPUs have device ID %q; use DEVICE_ID_STRATEGY=uuid", e.ID)
		}
		t.byID[e.ID] = len(t.entries)
		t.entries = append(t.entries, e)
	}
	t.score = make([][]int, len(t.entries))
	for i, a := range t.entries {
		t.score[i] = make([]int, len(t.entries))
		for j, b := range t.entries {
			if i != j {
				t.score[i][j] = pairScore(a.Device, b.Device, node.Link(a.Device.UUID, b.Device.UUID))
			}
		}
	}
	return t, nil
}

// pairScore rates how well two GPUs work together: NVLink first, then a
// closer PCIe common ancestor, then the same NUMA node.
func pairScore(a, b gpu.Device, l gpu.Link) int {
	s := 0
	if l.NVLink {
		s += 100
	}
	if l.Level > 0 && l.Level < 60 {
		s += 60 - l.Level
	}
	if a.NUMANode >= 0 && a.NUMANode == b.NUMANode {
		s += 10
	}
	return s
}

// Entries returns the published GPUs in order.
func (t *Table) Entries() []Entry { return t.entries }

// Lookup finds a published GPU by device ID.
func (t *Table) Lookup(id string) (Entry, bool) {
	i, ok := t.byID[id]
	if !ok {
		return Entry{}, false
	}
	return t.entries[i], true
}
