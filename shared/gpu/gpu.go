// Package gpu holds the facts nvinject knows about a node's NVIDIA GPUs:
// each GPU, its MIG devices (MIGDevice: a compute instance inside a GPU
// instance, with its profile and the /dev/nvidia-caps nodes that grant it),
// the driver-wide nodes and the links between GPUs. The types are plain data:
// both daemons and the CDI generator consume them; the backends that produce
// them (real NVML, simulated NVML) live in sub-packages.
package gpu

import (
	"context"
	"fmt"
	"time"
)

// NVIDIA's character device major for /dev/nvidiaN, /dev/nvidiactl and
// /dev/nvidia-modeset: a constant of the kernel driver (NV_MAJOR_DEVICE_NUMBER).
const NVIDIAMajor = 195

// Minor numbers the driver reserves on major 195.
const (
	CtlMinor     = 255
	ModesetMinor = 254
)

// DeviceNode is a character device as CDI and OCI describe it.
type DeviceNode struct {
	Path  string
	Type  string
	Major int64
	Minor int64
}

// Device is one physical GPU.
type Device struct {
	UUID        string
	Index       int
	Minor       int
	Name        string
	MemoryBytes uint64
	PCIBusID    string
	// NUMANode is -1 when the platform does not report one.
	NUMANode int
	// MIGCapable is whether the GPU supports MIG at all (NVML answers its
	// MIG mode); MIGEnabled whether MIG mode is on.
	MIGCapable bool
	MIGEnabled bool
	Node       DeviceNode
	// Architecture ("Ampere") and ComputeCapability ("8.0") are empty when
	// NVML does not report them.
	Architecture      string
	ComputeCapability string
	// MIG lists the MIG devices that exist on the GPU, in GPU instance then
	// compute instance order; empty when MIG mode is off or no instance
	// exists.
	MIG []MIGDevice
	// MIGErr is why the GPU's MIG devices could not be read (an NVML
	// error, a capability file missing): the GPU is still discovered, so a
	// broken MIG GPU does not take the node's whole GPUs down; whatever
	// would serve its slices refuses it with this, and
	// --mig-strategy=none skips MIG GPUs anyway.
	MIGErr error
}

// MIGDevice is one MIG device: a compute instance (CI) inside a GPU
// instance (GI) on a parent GPU with MIG mode on. CUDA and containers see
// it as a GPU of its own, named by its UUID.
type MIGDevice struct {
	// UUID is NVML's "MIG-..." UUID.
	UUID       string
	ParentUUID string
	// GPUInstance and ComputeInstance are NVML's GI and CI IDs: the GI's ID
	// on the parent, the CI's within the GI.
	GPUInstance     int
	ComputeInstance int
	// Profile is NVIDIA's name for the MIG device's shape: "1g.10gb",
	// "3g.40gb", "1g.10gb+me" (media extensions), or "1c.3g.40gb" when the
	// CI has fewer slices than its GI.
	Profile     string
	MemoryBytes uint64
	// GPUSlices is the GI's slice count (the "g" of the profile);
	// ComputeSlices the CI's (the "c"); Multiprocessors the CI's SMs.
	GPUSlices       int
	ComputeSlices   int
	Multiprocessors int
	// Placement is where the GI sits on the parent, as NVML reports it.
	Placement MIGPlacement
	// Parent is the parent's /dev/nvidiaN. GIAccess and CIAccess are the
	// /dev/nvidia-caps/nvidia-capN nodes whose open grants the GI and the
	// CI: a container gets all three to use this MIG device and no other.
	Parent   DeviceNode
	GIAccess DeviceNode
	CIAccess DeviceNode
}

// MIGPlacement is a GI's first slice on its GPU and the slices it spans.
type MIGPlacement struct {
	Start int
	Size  int
}

// Link describes how two GPUs reach each other.
type Link struct {
	NVLink bool
	// Level is NVML's topology level of the pair's common PCIe ancestor
	// (10 same board ... 50 across sockets); 0 when unknown.
	Level int
}

// Node is everything discovered about one node's GPUs at one moment.
type Node struct {
	DriverVersion string
	// DriverSource says where DriverVersion came from, for messages: "NVML",
	// or for a simulation the option or driver root it follows.
	DriverSource string
	CUDAVersion  string
	Devices      []Device
	// ControlNodes are the driver-wide nodes present on the host
	// (/dev/nvidiactl, /dev/nvidia-uvm, ...).
	ControlNodes []DeviceNode
	// MIGConfig and MIGMonitor are /dev/nvidia-caps' config and monitor
	// nodes (nvidia-cap1 and nvidia-cap2): config lets a process create and
	// destroy GPU instances (nvidia-smi mig, mig-parted), monitor lets it
	// observe all of them (DCGM). Zero when no GPU has MIG mode on.
	MIGConfig  DeviceNode
	MIGMonitor DeviceNode
	// Links is keyed by both UUIDs of a pair, in either order.
	Links map[string]map[string]Link
	// Simulated is true when the facts come from nvinject's simulated NVML.
	Simulated bool
}

// Device returns the device with the given UUID.
func (n Node) Device(uuid string) (Device, bool) {
	for _, d := range n.Devices {
		if d.UUID == uuid {
			return d, true
		}
	}
	return Device{}, false
}

// Link returns how a and b are connected; the zero Link when unknown.
func (n Node) Link(a, b string) Link {
	return n.Links[a][b]
}

// UUIDs lists the devices' UUIDs in index order.
func (n Node) UUIDs() []string {
	out := make([]string, 0, len(n.Devices))
	for _, d := range n.Devices {
		out = append(out, d.UUID)
	}
	return out
}

// EventKind says what a health event reports.
type EventKind int

const (
	// EventXid is an NVML Xid critical error on one GPU.
	EventXid EventKind = iota + 1
	// EventLost means the GPU fell off the bus or stopped answering.
	EventLost
	// EventWatching says the watch is armed: every listed GPU is
	// registered for events, so from here on none is missed. It carries no
	// UUID and is sent once per WatchHealth call.
	EventWatching
)

func (k EventKind) String() string {
	switch k {
	case EventXid:
		return "xid"
	case EventLost:
		return "gpu-lost"
	case EventWatching:
		return "watching"
	default:
		return fmt.Sprintf("event(%d)", int(k))
	}
}

// HealthEvent is one health signal for one GPU.
type HealthEvent struct {
	UUID string
	Kind EventKind
	Xid  uint64
	Time time.Time
}

// DeviceHealth is what NVML answers, when asked, about one GPU's memory
// health. A check a GPU does not support reads as its healthy value.
type DeviceHealth struct {
	// RetiredPagesPending: pages are waiting to be retired, which takes a
	// GPU reset (nvmlDeviceGetRetiredPagesPendingStatus).
	RetiredPagesPending bool
	// RowRemapFailure: a row could not be remapped (nvmlDeviceGetRemappedRows).
	RowRemapFailure bool
	// RowRemapPending: a remapping waits for a GPU reset.
	RowRemapPending bool
	// ECCSupported says whether VolatileUncorrectedECC is meaningful.
	ECCSupported bool
	// VolatileUncorrectedECC counts uncorrected ECC errors since the last
	// driver load (nvmlDeviceGetTotalEccErrors, volatile, uncorrected).
	VolatileUncorrectedECC uint64
}

// Inventory discovers GPUs and streams their health events.
type Inventory interface {
	Discover(ctx context.Context) (Node, error)
	// WatchHealth delivers events for the given GPUs until ctx ends; it
	// sends one EventWatching once all are registered. It returns an error
	// if monitoring cannot start or breaks down.
	WatchHealth(ctx context.Context, uuids []string, events chan<- HealthEvent) error
	// CheckHealth asks NVML about one GPU; an error means the GPU does not
	// answer.
	CheckHealth(ctx context.Context, uuid string) (DeviceHealth, error)
	Close() error
}

// MIGSlot is a place on a GPU with MIG mode on where a GPU instance of one
// profile, with one compute instance over all its slices, can be made.
type MIGSlot struct {
	// Profile is NVIDIA's name ("1g.10gb"); GIProfile the NVML profile
	// constant it is made from.
	Profile   string
	GIProfile int
	Placement MIGPlacement
	// MemoryBytes, GPUSlices and Multiprocessors are what the made MIG
	// device has.
	MemoryBytes     uint64
	GPUSlices       int
	Multiprocessors int
}
