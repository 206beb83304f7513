// Package gpu holds the facts nvinject knows about a node's NVIDIA GPUs.
// Both daemons and the CDI generator consume these types; the backends that
// produce them (real NVML, simulated NVML) live in sub-packages.
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
	NUMANode   int
	MIGEnabled bool
	Node       DeviceNode
	// Architecture ("Ampere") and ComputeCapability ("8.0") are empty when
	// NVML does not report them.
	Architecture      string
	ComputeCapability string
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
