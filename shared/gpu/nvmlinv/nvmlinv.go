// Package nvmlinv implements gpu.Inventory on top of an nvml.Interface:
// discovery (GPUs, their MIG devices with the caps nodes the driver's
// capability files name, topology) and health. The same code serves real
// NVML and nvinject's simulated NVML, so a simulation exercises the
// discovery and health paths a real node runs.
package nvmlinv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/nvcaps"
)

// NodeLookup resolves a /dev path to the node the host really has. The
// simulated backend answers from its own table.
type NodeLookup interface {
	Lookup(path string) (gpu.DeviceNode, bool, error)
}

// Inventory is a gpu.Inventory backed by NVML.
type Inventory struct {
	lib       nvml.Interface
	nodes     NodeLookup
	caps      fs.FS
	capsWhere string
	simulated bool
	source    string
	waitSlice uint32
	// migChanged shares a MIG layout CreateMIG or DestroyMIG changed
	// (WithMIGChanged).
	migChanged func() error

	mu     sync.Mutex
	closed bool
}

// Option configures an Inventory.
type Option func(*Inventory)

// WithNodeLookup sets how device nodes are found (default: stat under /).
func WithNodeLookup(l NodeLookup) Option { return func(i *Inventory) { i.nodes = l } }

// WithCaps sets where the driver's capability files (/proc/driver/nvidia/
// capabilities, /proc/devices) are read: fsys stands for the host's /, and
// where names it in errors. The default is the host's own /proc, which a
// container shares with the host for these files.
func WithCaps(fsys fs.FS, where string) Option {
	return func(i *Inventory) { i.caps, i.capsWhere = fsys, where }
}

// WithSimulated marks the facts as simulated.
func WithSimulated() Option { return func(i *Inventory) { i.simulated = true } }

// WithDriverSource says where the driver version NVML reports comes from
// (default "NVML"); the simulation names the option or root it follows.
func WithDriverSource(s string) Option { return func(i *Inventory) { i.source = s } }

// WithWaitSlice bounds one NVML event wait, and so how fast WatchHealth
// notices its context ending.
func WithWaitSlice(d time.Duration) Option {
	return func(i *Inventory) { i.waitSlice = uint32(d / time.Millisecond) }
}

// WithMIGChanged calls f after CreateMIG or DestroyMIG changed the MIG
// layout: a SIMULATED node shares its layout with the node's other
// processes through it, as a real driver's kernel module does by itself.
func WithMIGChanged(f func() error) Option { return func(i *Inventory) { i.migChanged = f } }

// ErrLibraryNotFound is returned when libnvidia-ml.so.1 cannot be loaded.
var ErrLibraryNotFound = errors.New("NVML library libnvidia-ml.so.1 not found")

// ErrDriverNotLoaded is returned when NVML loads but the kernel module is not.
var ErrDriverNotLoaded = errors.New("NVML: Driver Not Loaded")

// New initialises NVML through lib and returns the inventory.
func New(lib nvml.Interface, opts ...Option) (*Inventory, error) {
	inv := &Inventory{lib: lib, nodes: StatLookup{Root: "/"}, caps: os.DirFS("/"), capsWhere: "the host's /", source: "NVML", waitSlice: 1000}
	for _, o := range opts {
		o(inv)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, fmt.Errorf("%w: the NVIDIA driver's user-space library is not visible to this process; check that the driver is installed on the host (nvidia-smi works there), that the driver root is mounted and --driver-root points at it, or use --nvml=sim:a100-80gb for a simulated node", ErrLibraryNotFound)
		}
		if ret == nvml.ERROR_DRIVER_NOT_LOADED {
			return nil, fmt.Errorf("%w: NVML's library loaded but the NVIDIA kernel module is not: check `lsmod | grep nvidia` on the host (load it with `modprobe nvidia`, or see why it fails in `dmesg`) and that /dev/nvidiactl exists; use --nvml=sim:a100-80gb for a simulated node", ErrDriverNotLoaded)
		}
		return nil, fmt.Errorf("initialise NVML: %s; check the driver with nvidia-smi on the host", nvml.ErrorString(ret))
	}
	return inv, nil
}

// Close shuts NVML down once.
func (i *Inventory) Close() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed {
		return nil
	}
	i.closed = true
	if ret := i.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shut down NVML: %s", nvml.ErrorString(ret))
	}
	return nil
}

// Discover reads the node's GPUs, their MIG devices, device nodes and
// pairwise topology.
func (i *Inventory) Discover(ctx context.Context) (gpu.Node, error) {
	node := gpu.Node{Simulated: i.simulated, DriverSource: i.source, Links: map[string]map[string]gpu.Link{}}
	var ret nvml.Return
	if node.DriverVersion, ret = i.lib.SystemGetDriverVersion(); ret != nvml.SUCCESS {
		return gpu.Node{}, nvmlErr("read the driver version", ret)
	}
	cuda, ret := i.lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return gpu.Node{}, nvmlErr("read the CUDA driver version", ret)
	}
	node.CUDAVersion = fmt.Sprintf("%d.%d", cuda/1000, (cuda%1000)/10)

	count, ret := i.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return gpu.Node{}, nvmlErr("count GPUs", ret)
	}
	handles := make([]nvml.Device, 0, count)
	caps := nvcaps.New(i.caps, i.capsWhere)
	mig := false
	for idx := 0; idx < count; idx++ {
		if err := ctx.Err(); err != nil {
			return gpu.Node{}, err
		}
		h, ret := i.lib.DeviceGetHandleByIndex(idx)
		if ret != nvml.SUCCESS {
			return gpu.Node{}, nvmlErr(fmt.Sprintf("open GPU %d", idx), ret)
		}
		d, err := i.device(idx, h, caps)
		if err != nil {
			return gpu.Node{}, err
		}
		mig = mig || d.MIGEnabled
		node.Devices = append(node.Devices, d)
		handles = append(handles, h)
	}
	for a := range handles {
		for b := a + 1; b < len(handles); b++ {
			l := link(handles[a], handles[b])
			ua, ub := node.Devices[a].UUID, node.Devices[b].UUID
			setLink(node.Links, ua, ub, l)
			setLink(node.Links, ub, ua, l)
		}
	}
	ctl, err := i.controlNodes()
	if err != nil {
		return gpu.Node{}, err
	}
	node.ControlNodes = ctl
	if mig {
		var cerr, merr error
		node.MIGConfig, cerr = caps.Node(nvcaps.ConfigFile)
		node.MIGMonitor, merr = caps.Node(nvcaps.MonitorFile)
		if err := errors.Join(cerr, merr); err != nil {
			// Without the node-wide MIG capabilities no slice can be
			// served: every MIG GPU carries the reason.
			for k := range node.Devices {
				if node.Devices[k].MIGEnabled && node.Devices[k].MIGErr == nil {
					node.Devices[k].MIGErr = fmt.Errorf("MIG config/monitor capability: %w", err)
				}
			}
		}
	}
	return node, nil
}

func setLink(m map[string]map[string]gpu.Link, a, b string, l gpu.Link) {
	if m[a] == nil {
		m[a] = map[string]gpu.Link{}
	}
	m[a][b] = l
}

func (i *Inventory) device(idx int, h nvml.Device, caps *nvcaps.Reader) (gpu.Device, error) {
	d := gpu.Device{Index: idx, NUMANode: -1}
	var ret nvml.Return
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("read GPU %d's UUID", idx), ret)
	}
	if d.Minor, ret = h.GetMinorNumber(); ret != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("read GPU %s's minor number", d.UUID), ret)
	}
	if d.Name, ret = h.GetName(); ret != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("read GPU %s's name", d.UUID), ret)
	}
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("read GPU %s's memory", d.UUID), ret)
	}
	d.MemoryBytes = mem.Total
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return d, nvmlErr(fmt.Sprintf("read GPU %s's PCI info", d.UUID), ret)
	}
	d.PCIBusID = busID(pci)
	if numa, ret := h.GetNumaNodeId(); ret == nvml.SUCCESS {
		d.NUMANode = numa
	}
	if arch, ret := h.GetArchitecture(); ret == nvml.SUCCESS {
		d.Architecture = archNames[arch]
	}
	if major, minor, ret := h.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		d.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	}
	// MIG is unsupported on many GPUs: treat "not supported" as off.
	if cur, _, ret := h.GetMigMode(); ret == nvml.SUCCESS {
		d.MIGCapable = true
		d.MIGEnabled = cur == nvml.DEVICE_MIG_ENABLE
	} else if ret != nvml.ERROR_NOT_SUPPORTED {
		return d, nvmlErr(fmt.Sprintf("read GPU %s's MIG mode", d.UUID), ret)
	}
	path := fmt.Sprintf("/dev/nvidia%d", d.Minor)
	n, ok, err := i.nodes.Lookup(path)
	if err != nil {
		return d, err
	}
	if !ok {
		// The driver creates the node on first open; its number is fixed.
		n = gpu.DeviceNode{Path: path, Type: "c", Major: gpu.NVIDIAMajor, Minor: int64(d.Minor)}
	}
	d.Node = n
	if d.MIGEnabled {
		d.MIG, d.MIGErr = migDevices(d, h, caps)
	}
	return d, nil
}

func (i *Inventory) controlNodes() ([]gpu.DeviceNode, error) {
	var out []gpu.DeviceNode
	for _, p := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"} {
		n, ok, err := i.nodes.Lookup(p)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, n)
		}
	}
	if len(out) == 0 || out[0].Path != "/dev/nvidiactl" {
		return nil, fmt.Errorf("/dev/nvidiactl is missing: the NVIDIA kernel module is not loaded or /dev is not visible to this process; load the driver (nvidia-smi on the host creates it) or mount the host /dev")
	}
	return out, nil
}

func link(a, b nvml.Device) gpu.Link {
	var l gpu.Link
	if st, ret := a.GetP2PStatus(b, nvml.P2P_CAPS_INDEX_NVLINK); ret == nvml.SUCCESS {
		l.NVLink = st == nvml.P2P_STATUS_OK
	}
	if lvl, ret := a.GetTopologyCommonAncestor(b); ret == nvml.SUCCESS {
		l.Level = int(lvl)
	}
	return l
}

// archNames are NVML's architecture names (nvml.h); others stay empty.
var archNames = map[nvml.DeviceArchitecture]string{
	nvml.DEVICE_ARCH_KEPLER: "Kepler", nvml.DEVICE_ARCH_MAXWELL: "Maxwell", nvml.DEVICE_ARCH_PASCAL: "Pascal",
	nvml.DEVICE_ARCH_VOLTA: "Volta", nvml.DEVICE_ARCH_TURING: "Turing", nvml.DEVICE_ARCH_AMPERE: "Ampere",
	nvml.DEVICE_ARCH_ADA: "Ada Lovelace", nvml.DEVICE_ARCH_HOPPER: "Hopper", nvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
	nvml.DEVICE_ARCH_RUBIN: "Rubin",
}

func busID(p nvml.PciInfo) string {
	var b strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	// NVML reports an 8-digit domain ("00000000:07:00.0"); keep the
	// 4-digit form sysfs and Kubernetes tooling use.
	id := strings.ToLower(b.String())
	if len(id) == 16 && strings.HasPrefix(id, "0000") {
		id = id[4:]
	}
	return id
}

// nvmlErr wraps NVML's return code, so callers can tell, say, an instance
// that went away (nvml.ERROR_NOT_FOUND) from a broken driver.
func nvmlErr(what string, ret nvml.Return) error {
	return fmt.Errorf("NVML: %s: %w", what, ret)
}

// WatchHealth registers for Xid critical errors on the given GPUs, sends
// EventWatching, and delivers the events until ctx ends.
func (i *Inventory) WatchHealth(ctx context.Context, uuids []string, events chan<- gpu.HealthEvent) error {
	set, ret := i.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nvmlErr("create an event set", ret)
	}
	defer set.Free()

	for _, u := range uuids {
		h, ret := i.lib.DeviceGetHandleByUUID(u)
		if ret != nvml.SUCCESS {
			return nvmlErr("open GPU "+u+" for health events", ret)
		}
		supported, ret := h.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			return nvmlErr("read the event types GPU "+u+" supports", ret)
		}
		want := uint64(nvml.EventTypeXidCriticalError)
		if supported&want == 0 {
			return fmt.Errorf("GPU %s does not report Xid events, so its health cannot be watched", u)
		}
		if ret := h.RegisterEvents(want, set); ret != nvml.SUCCESS {
			return nvmlErr("register Xid events on GPU "+u, ret)
		}
	}
	if !send(ctx, events, gpu.HealthEvent{Kind: gpu.EventWatching, Time: time.Now()}) {
		return nil
	}

	for ctx.Err() == nil {
		e, ret := set.Wait(i.waitSlice)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		case nvml.ERROR_GPU_IS_LOST:
			// NVML does not say which GPU; every watched one is suspect.
			now := time.Now()
			for _, u := range uuids {
				if !send(ctx, events, gpu.HealthEvent{UUID: u, Kind: gpu.EventLost, Time: now}) {
					return nil
				}
			}
			continue
		default:
			return nvmlErr("wait for health events", ret)
		}
		if e.EventType != nvml.EventTypeXidCriticalError || e.Device == nil {
			continue
		}
		u, ret := e.Device.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		if !send(ctx, events, gpu.HealthEvent{UUID: u, Kind: gpu.EventXid, Xid: e.EventData, Time: time.Now()}) {
			return nil
		}
	}
	return nil
}

func send(ctx context.Context, ch chan<- gpu.HealthEvent, e gpu.HealthEvent) bool {
	select {
	case ch <- e:
		return true
	case <-ctx.Done():
		return false
	}
}

// StatLookup finds device nodes by stat under Root (the host's / or a
// mounted copy of its /dev's parent).
type StatLookup struct{ Root string }

// Lookup implements NodeLookup.
func (s StatLookup) Lookup(path string) (gpu.DeviceNode, bool, error) {
	var st syscall.Stat_t
	full := filepath.Join(s.Root, path)
	if err := syscall.Stat(full, &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return gpu.DeviceNode{}, false, nil
		}
		return gpu.DeviceNode{}, false, fmt.Errorf("stat %s: %w", full, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		return gpu.DeviceNode{}, false, fmt.Errorf("%s is not a character device; check --driver-root/--dev-root", full)
	}
	rdev := uint64(st.Rdev)
	major := int64((rdev>>8)&0xfff) | int64((rdev>>32)&^0xfff)
	minor := int64(rdev&0xff) | int64((rdev>>12)&^0xff)
	return gpu.DeviceNode{Path: path, Type: "c", Major: major, Minor: minor}, true, nil
}
