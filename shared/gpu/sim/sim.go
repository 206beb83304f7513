// Package sim is nvinject's SIMULATED GPU node: go-nvml's mock NVML server
// (DGX A100 shape) made deterministic, with injectable health events (Xids)
// and NVML health faults. It is SIMULATION equipment for tests and demos;
// nothing here talks to a real GPU. It is chosen in one place,
// shared/gpu/backend, for an --nvml value "sim:..."; the kubelet plugins'
// HTTP fault routes over it are gpunode/simdebug (gpunode/README.md lists
// the whole simulation seam).
package sim

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/nvinject/nvinject/shared/driverroot"
	"github.com/nvinject/nvinject/shared/gpu"
)

// Prefix marks a simulated --nvml value: "sim:a100-80gb", "sim:a100-80gb*8",
// "sim:a100-80gb*8,mig=3" (GPU 3 with MIG mode on),
// "sim:a100-80gb,driver=535.261.03" (the driver version NVML reports).
const Prefix = "sim:"

// UVMMajor is the major the simulation gives /dev/nvidia-uvm (dynamic on a
// real host, read from /proc/devices there).
const UVMMajor = 508

// DriverVersion and CUDADriverVersion are what the simulated node reports
// when neither a driver= option nor a driver root names another driver.
const (
	DriverVersion     = "580.95.05"
	CUDADriverVersion = 13000
)

// cudaByBranch is the CUDA version (NVML's 1000*major+10*minor) that each
// NVIDIA driver branch supports, from the CUDA Toolkit release notes' driver
// table; a branch between two rows supports the lower row's version.
var cudaByBranch = []struct{ branch, cuda int }{
	{470, 11040}, {510, 11060}, {515, 11070}, {520, 11080}, {525, 12000},
	{530, 12010}, {535, 12020}, {545, 12030}, {550, 12040}, {555, 12050},
	{560, 12060}, {565, 12070}, {570, 12080}, {575, 12090}, {580, 13000},
}

// CUDAVersionFor returns the CUDA version a driver version's branch
// supports, as NVML reports it (12020 for 535.261.03). ok is false for a
// branch older than the table.
func CUDAVersionFor(driver string) (cuda int, ok bool) {
	major, _, _ := strings.Cut(driver, ".")
	b, err := strconv.Atoi(major)
	if err != nil {
		return 0, false
	}
	for _, row := range cudaByBranch {
		if row.branch <= b {
			cuda, ok = row.cuda, true
		}
	}
	return cuda, ok
}

var models = map[string]gpus.Config{
	"a100-80gb":      gpus.A100_SXM4_80GB,
	"a100-40gb":      gpus.A100_SXM4_40GB,
	"a100-pcie-80gb": gpus.A100_PCIE_80GB,
}

// Spec is a parsed simulation value.
type Spec struct {
	Model string
	Count int
	MIG   []int
	// Driver is the driver version NVML reports; "" for DriverVersion.
	Driver string
}

// DriverVersion is the driver version the simulated NVML reports.
func (s Spec) DriverVersion() string {
	if s.Driver != "" {
		return s.Driver
	}
	return DriverVersion
}

// String renders the spec back into its --nvml form.
func (s Spec) String() string {
	out := Prefix + s.Model
	if s.Count != 1 {
		out += "*" + strconv.Itoa(s.Count)
	}
	if len(s.MIG) > 0 {
		parts := make([]string, len(s.MIG))
		for i, m := range s.MIG {
			parts[i] = strconv.Itoa(m)
		}
		out += ",mig=" + strings.Join(parts, "+")
	}
	if s.Driver != "" {
		out += ",driver=" + s.Driver
	}
	return out
}

// IsSim reports whether an --nvml value asks for the simulation.
func IsSim(v string) bool { return strings.HasPrefix(v, Prefix) }

// ParseSpec parses "sim:<model>[*N][,mig=I[+J...]][,driver=VERSION]".
func ParseSpec(v string) (Spec, error) {
	if !IsSim(v) {
		return Spec{}, fmt.Errorf("--nvml=%q is not a simulation value; use sim:a100-80gb or sim:a100-80gb*8", v)
	}
	body := strings.TrimPrefix(v, Prefix)
	body, opts, hasOpts := strings.Cut(body, ",")
	s := Spec{Model: body, Count: 1}
	if m, n, ok := strings.Cut(body, "*"); ok {
		c, err := strconv.Atoi(n)
		if err != nil || c < 1 || c > 16 {
			return Spec{}, fmt.Errorf("--nvml=%q: GPU count %q must be a number from 1 to 16", v, n)
		}
		s.Model, s.Count = m, c
	}
	if _, ok := models[s.Model]; !ok {
		return Spec{}, fmt.Errorf("--nvml=%q: unknown simulated model %q; known: %s", v, s.Model, strings.Join(Models(), ", "))
	}
	for opt := range strings.SplitSeq(opts, ",") {
		if !hasOpts {
			break
		}
		k, val, _ := strings.Cut(opt, "=")
		switch k {
		case "mig":
			if s.MIG != nil {
				return Spec{}, fmt.Errorf("--nvml=%q: mig= is given twice; list the GPUs once, joined with +", v)
			}
			for _, f := range strings.Split(val, "+") {
				i, err := strconv.Atoi(f)
				if err != nil || i < 0 || i >= s.Count {
					return Spec{}, fmt.Errorf("--nvml=%q: mig index %q must be a GPU index from 0 to %d", v, f, s.Count-1)
				}
				s.MIG = append(s.MIG, i)
			}
		case "driver":
			if !driverroot.ValidVersion(val) {
				return Spec{}, fmt.Errorf("--nvml=%q: driver=%q is not a driver version; give one such as 535.261.03", v, val)
			}
			if _, ok := CUDAVersionFor(val); !ok {
				return Spec{}, fmt.Errorf("--nvml=%q: driver=%q is older than the simulation knows (branch %d and later)", v, val, cudaByBranch[0].branch)
			}
			s.Driver = val
		default:
			return Spec{}, fmt.Errorf("--nvml=%q: unknown option %q; the options are mig=I[+J] and driver=VERSION", v, k)
		}
	}
	return s, nil
}

// Models lists the simulated models.
func Models() []string {
	return []string{"a100-40gb", "a100-80gb", "a100-pcie-80gb"}
}

// UUID is the deterministic UUID of simulated GPU index of a model, the same
// in every process and for every GPU count, so one ConfigMap value selects
// the same GPU on a 1-GPU and an 8-GPU simulated node.
func UUID(model string, index int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("nvinject-sim/%s/%d", model, index)))
	h[6] = (h[6] & 0x0f) | 0x50 // version 5 shape, so it reads as a UUID
	h[8] = (h[8] & 0x3f) | 0x80
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// BusID is simulated GPU index's PCI bus ID, shaped like a DGX A100's.
func BusID(index int) string {
	buses := []int{0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd}
	b := 0xc0 + index
	if index < len(buses) {
		b = buses[index]
	}
	return fmt.Sprintf("0000:%02x:00.0", b)
}

// NUMANode of simulated GPU index: four GPUs per socket, as on a DGX A100.
func NUMANode(index int) int { return index / 4 }

// Node is a simulated node: an nvml.Interface plus fault injection.
type Node struct {
	spec   Spec
	server *server.Server

	mu     sync.Mutex
	regs   map[chan nvml.EventData]map[string]bool
	faults *faultTable
}

// New builds the simulated node for spec.
func New(spec Spec) *Node {
	cfgs := gpus.Multiple(spec.Count, models[spec.Model])
	srv := dgxa100.NewWithGPUs(cfgs...)
	srv.DriverVersion = spec.DriverVersion()
	srv.CudaDriverVersion, _ = CUDAVersionFor(srv.DriverVersion)
	n := &Node{spec: spec, server: srv, regs: map[chan nvml.EventData]map[string]bool{}, faults: &faultTable{byID: map[string]*deviceFaults{}}}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.UUID = UUID(spec.Model, i)
		dev.PciBusID = BusID(i)
		n.wireDevice(dev)
		n.wireHealthQueries(dev)
	}
	for _, m := range spec.MIG {
		srv.Devices[m].(*server.Device).MigMode = nvml.DEVICE_MIG_ENABLE
	}
	srv.EventSetCreateFunc = n.newEventSet
	return n
}

// Spec returns the simulation's spec.
func (n *Node) Spec() Spec { return n.spec }

// NVML returns the simulated library.
func (n *Node) NVML() nvml.Interface { return n.server }

func (n *Node) wireDevice(dev *server.Device) {
	dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p := nvml.PciInfo{PciDeviceId: dev.Config.PciDeviceId}
		id := "0000" + dev.PciBusID
		for i := 0; i < len(id) && i < len(p.BusId)-1; i++ {
			p.BusId[i] = int8(id[i])
		}
		return p, nvml.SUCCESS
	}
	dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return NUMANode(dev.Index), nvml.SUCCESS }
	// Every GPU of a DGX A100 reaches every other over NVSwitch.
	dev.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
		return nvml.P2P_STATUS_OK, nvml.SUCCESS
	}
	dev.GetTopologyCommonAncestorFunc = func(o nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		other := o.(*server.Device)
		switch {
		case dev.Index/2 == other.Index/2:
			return nvml.TOPOLOGY_MULTIPLE, nvml.SUCCESS
		case NUMANode(dev.Index) == NUMANode(other.Index):
			return nvml.TOPOLOGY_NODE, nvml.SUCCESS
		default:
			return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
		}
	}
	dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError, nvml.SUCCESS
	}
	dev.RegisterEventsFunc = func(_ uint64, set nvml.EventSet) nvml.Return {
		es, ok := set.(*eventSet)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		n.mu.Lock()
		n.regs[es.ch][dev.UUID] = true
		n.mu.Unlock()
		return nvml.SUCCESS
	}
}

type eventSet struct {
	mock.EventSet
	ch chan nvml.EventData
}

func (n *Node) newEventSet() (nvml.EventSet, nvml.Return) {
	es := &eventSet{ch: make(chan nvml.EventData, 64)}
	es.WaitFunc = func(ms uint32) (nvml.EventData, nvml.Return) {
		select {
		case e := <-es.ch:
			return e, nvml.SUCCESS
		case <-afterMillis(ms):
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
	es.FreeFunc = func() nvml.Return {
		n.mu.Lock()
		delete(n.regs, es.ch)
		n.mu.Unlock()
		return nvml.SUCCESS
	}
	n.mu.Lock()
	n.regs[es.ch] = map[string]bool{}
	n.mu.Unlock()
	return es, nvml.SUCCESS
}

// ErrNoWatcher is returned when an injected event reaches no event set.
var ErrNoWatcher = errors.New("no health watcher is registered for that GPU")

// InjectXid delivers an Xid critical error for the GPU with uuid to every
// event set that registered it, as the driver would.
func (n *Node) InjectXid(uuid string, xid uint64) error {
	var dev nvml.Device
	for _, d := range n.server.Devices {
		if d.(*server.Device).UUID == uuid {
			dev = d
		}
	}
	if dev == nil {
		return fmt.Errorf("simulated GPU %s does not exist; simulated UUIDs: %s", uuid, strings.Join(n.uuids(), ", "))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	delivered := false
	for ch, reg := range n.regs {
		if !reg[uuid] {
			continue
		}
		select {
		case ch <- nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: xid}:
			delivered = true
		default:
			return fmt.Errorf("simulated event queue for GPU %s is full; the health watcher is not reading", uuid)
		}
	}
	if !delivered {
		return fmt.Errorf("inject Xid %d on %s: %w", xid, uuid, ErrNoWatcher)
	}
	return nil
}

func (n *Node) uuids() []string {
	out := make([]string, len(n.server.Devices))
	for i, d := range n.server.Devices {
		out[i] = d.(*server.Device).UUID
	}
	return out
}

// Nodes answers device-node lookups for the simulated GPUs: the nodes a
// host with this driver would have.
func (n *Node) Nodes() Lookup { return Lookup{count: n.spec.Count} }

// Lookup implements nvmlinv.NodeLookup for the simulation.
type Lookup struct{ count int }

// Lookup returns the simulated node for a /dev path.
func (l Lookup) Lookup(path string) (gpu.DeviceNode, bool, error) {
	c := func(maj, min int64) (gpu.DeviceNode, bool, error) {
		return gpu.DeviceNode{Path: path, Type: "c", Major: maj, Minor: min}, true, nil
	}
	switch path {
	case "/dev/nvidiactl":
		return c(gpu.NVIDIAMajor, gpu.CtlMinor)
	case "/dev/nvidia-modeset":
		return c(gpu.NVIDIAMajor, gpu.ModesetMinor)
	case "/dev/nvidia-uvm":
		return c(UVMMajor, 0)
	case "/dev/nvidia-uvm-tools":
		return c(UVMMajor, 1)
	}
	if s, ok := strings.CutPrefix(path, "/dev/nvidia"); ok {
		if i, err := strconv.Atoi(s); err == nil && i >= 0 && i < l.count {
			return c(gpu.NVIDIAMajor, int64(i))
		}
	}
	return gpu.DeviceNode{}, false, nil
}
