//go:build !nosim

// Package sim is nvinject's SIMULATED GPU node: go-nvml's mock NVML server
// (A100, H100 and H200 GPUs on a DGX-shaped node) made deterministic, with
// MIG layouts created through NVML's own calls, the driver's MIG capability
// files, injectable health events (Xids) and NVML health faults. It is
// SIMULATION equipment for tests and demos; nothing here talks to a real
// GPU. It is chosen in one place, shared/gpu/backend, for an --nvml value
// "sim:..."; the kubelet plugins' HTTP fault routes over it are
// gpunode/simdebug (gpunode/README.md lists the whole simulation seam).
//
// The value's grammar:
//
//	sim:<model>[*N][,mig=<entry>[/<entry>...]][,driver=VERSION]
//	<entry>   = <gpus>[:<layout>]       GPUs with MIG mode on, and their instances
//	<gpus>    = I[+J...]                GPU indices, from 0 to N-1
//	<layout>  = <profile>[*K][+...]     one GPU instance (with one compute instance) per profile, K times
//	<profile> = NVIDIA's name on the model: 1g.10gb, 3g.40gb, 7g.80gb, 1g.10gb+me,
//	            1c.3g.40gb (a 1-slice compute instance in a 3g GPU instance), ...
//
// so "sim:a100-80gb*8,mig=3" turns MIG mode on for GPU 3 with no instances,
// "sim:h100-80gb*8,mig=3:1g.10gb+1g.10gb+3g.40gb" gives GPU 3 three
// instances, and "sim:h200-141gb*8,mig=0+1:1g.18gb*7/4:7g.141gb" lays out
// GPUs 0, 1 and 4. A layout must fit its GPU as the driver would place it;
// ParseSpec says what does not fit and what would. Every GPU and MIG
// device UUID derives from the model (and host=), index, GI and CI, so a value names
// the same devices in every process.
package sim

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/driverroot"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/sim/simholders"
)

// Prefix marks a simulated --nvml value: "sim:a100-80gb", "sim:a100-80gb*8",
// "sim:a100-80gb*8,mig=3" (GPU 3 with MIG mode on),
// "sim:a100-80gb*8,mig=3:3g.40gb+3g.40gb" (and two GPU instances),
// "sim:a100-80gb,driver=535.261.03" (the driver version NVML reports),
// "sim:a100-80gb*8,host=node-3" (UUIDs of their own, for a fleet).
const Prefix = contract.SimulatedNVML

// FromDriverRoot is the --nvml value of a SIMULATED node that its driver root names:
// the value in NodeFile there. One DaemonSet then simulates each node's own GPUs, as
// one DaemonSet finds each real node's GPUs.
const FromDriverRoot = Prefix + "driver-root"

// NodeFile in a SIMULATED node's driver root holds its --nvml value (one line).
const NodeFile = "usr/share/nvinject/simulated-node"

// Resolve returns value, or for FromDriverRoot the value root's NodeFile holds.
func Resolve(value, root string) (string, error) {
	if value != FromDriverRoot {
		return value, nil
	}
	if root == "" {
		return "", fmt.Errorf("--nvml=%s needs --driver-root: the simulated node is named in the driver root's %s", value, NodeFile)
	}
	data, err := os.ReadFile(filepath.Join(root, NodeFile))
	if err != nil {
		return "", fmt.Errorf("--nvml=%s: read the simulated node from the driver root: %w; write its sim:… value there, or give --nvml=sim:…", value, err)
	}
	v := strings.TrimSpace(string(data))
	if v == FromDriverRoot || !IsSim(v) {
		return "", fmt.Errorf("--nvml=%s: %s holds %s; want a sim:… value such as sim:a100-80gb*8", value, filepath.Join(root, NodeFile), strconv.Quote(v))
	}
	return v, nil
}

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
	"h100-80gb":      gpus.H100_SXM5_80GB,
	"h200-141gb":     gpus.H200_SXM5_141GB,
}

// Spec is a parsed simulation value.
type Spec struct {
	Model string
	Count int
	MIG   []MIGLayout
	// Driver is the driver version NVML reports; "" for DriverVersion.
	Driver string
	// Host seeds the GPUs' UUIDs (host=NAME), so simulated nodes of one model in a
	// fleet have distinct GPUs, as real ones do; "" keeps the model's UUIDs.
	Host string
}

// uuidModel is what the GPUs' UUIDs derive from.
func (s Spec) uuidModel() string {
	if s.Host == "" {
		return s.Model
	}
	return s.Host + "/" + s.Model
}

// MIGLayout is one mig= entry: GPUs whose MIG mode is on, and the
// profiles of the GPU instances each gets, in creation order (none: MIG
// mode on, no instances).
type MIGLayout struct {
	GPUs     []int
	Profiles []string
}

// layout returns the profiles of GPU index and whether its MIG mode is on.
func (s Spec) layout(index int) ([]string, bool) {
	for _, l := range s.MIG {
		if slices.Contains(l.GPUs, index) {
			return l.Profiles, true
		}
	}
	return nil, false
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
		entries := make([]string, len(s.MIG))
		for i, l := range s.MIG {
			idx := make([]string, len(l.GPUs))
			for j, g := range l.GPUs {
				idx[j] = strconv.Itoa(g)
			}
			entries[i] = strings.Join(idx, "+")
			if len(l.Profiles) > 0 {
				entries[i] += ":" + renderProfiles(l.Profiles)
			}
		}
		out += ",mig=" + strings.Join(entries, "/")
	}
	if s.Driver != "" {
		out += ",driver=" + s.Driver
	}
	if s.Host != "" {
		out += ",host=" + s.Host
	}
	return out
}

// IsSim reports whether an --nvml value asks for the simulation.
func IsSim(v string) bool { return contract.IsSimulatedNVML(v) }

// renderProfiles writes a layout with runs of one profile as profile*K.
func renderProfiles(names []string) string {
	var parts []string
	for i := 0; i < len(names); {
		j := i + 1
		for j < len(names) && names[j] == names[i] {
			j++
		}
		if j-i > 1 {
			parts = append(parts, fmt.Sprintf("%s*%d", names[i], j-i))
		} else {
			parts = append(parts, names[i])
		}
		i = j
	}
	return strings.Join(parts, "+")
}

// migSyntax is the mig= option's grammar, for errors.
const migSyntax = "mig=I[+J][:PROFILE[*K][+PROFILE]][/...] (e.g. mig=3, mig=3:1g.10gb*2+3g.40gb, mig=0+1:7g.80gb/2:3g.40gb*2)"

// ParseSpec parses "sim:<model>[*N][,mig=<entry>[/<entry>]][,driver=VERSION]"
// (the package documentation gives the grammar) and checks that each MIG
// layout fits its GPU.
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
				return Spec{}, fmt.Errorf("--nvml=%q: mig= is given twice; give one, its entries joined with /: %s", v, migSyntax)
			}
			layouts, err := parseMIG(s, val)
			if err != nil {
				return Spec{}, fmt.Errorf("--nvml=%q: %w", v, err)
			}
			s.MIG = layouts
		case "driver":
			if !driverroot.ValidVersion(val) {
				return Spec{}, fmt.Errorf("--nvml=%q: driver=%q is not a driver version; give one such as 535.261.03", v, val)
			}
			if _, ok := CUDAVersionFor(val); !ok {
				return Spec{}, fmt.Errorf("--nvml=%q: driver=%q is older than the simulation knows (branch %d and later)", v, val, cudaByBranch[0].branch)
			}
			s.Driver = val
		case "host":
			if val == "" || strings.ContainsAny(val, "/, ") {
				return Spec{}, fmt.Errorf("--nvml=%q: host=%q must be a name without '/', ',' or spaces, such as the node's name", v, val)
			}
			s.Host = val
		default:
			return Spec{}, fmt.Errorf("--nvml=%q: unknown option %q; the options are %s, driver=VERSION and host=NAME", v, k, migSyntax)
		}
	}
	return s, nil
}

// parseMIG parses the mig= value: entries joined with /, each GPUs joined
// with + and, after a colon, the profiles of their layout.
func parseMIG(s Spec, val string) ([]MIGLayout, error) {
	var out []MIGLayout
	seen := map[int]bool{}
	for _, entry := range strings.Split(val, "/") {
		idx, layout, hasLayout := strings.Cut(entry, ":")
		var l MIGLayout
		for _, f := range strings.Split(idx, "+") {
			i, err := strconv.Atoi(f)
			if err != nil || i < 0 || i >= s.Count {
				return nil, fmt.Errorf("mig index %q must be a GPU index from 0 to %d; the syntax is %s", f, s.Count-1, migSyntax)
			}
			if seen[i] {
				return nil, fmt.Errorf("mig= gives GPU %d twice; give each GPU in one entry", i)
			}
			seen[i] = true
			l.GPUs = append(l.GPUs, i)
		}
		if hasLayout {
			for _, f := range splitProfiles(layout) {
				name, times, multi := strings.Cut(f, "*")
				k := 1
				if multi {
					var err error
					if k, err = strconv.Atoi(times); err != nil || k < 1 || k > 16 {
						return nil, fmt.Errorf("mig= GPU %s: %q repeats a profile %q times; give a count from 1 to 16", idx, f, times)
					}
				}
				if name == "" {
					return nil, fmt.Errorf("mig= GPU %s has an empty profile; the syntax is %s", idx, migSyntax)
				}
				for range k {
					l.Profiles = append(l.Profiles, name)
				}
			}
			if _, _, err := plan(s.Model, l.Profiles); err != nil {
				return nil, fmt.Errorf("mig= GPU %s: %w", idx, err)
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// splitProfiles splits a layout at its +s, except the + of a variant's
// suffix ("1g.10gb+me"): a profile starts with a digit, a suffix with a
// letter.
func splitProfiles(layout string) []string {
	var out []string
	for _, f := range strings.Split(layout, "+") {
		if f != "" && (f[0] < '0' || f[0] > '9') && len(out) > 0 {
			out[len(out)-1] += "+" + f
			continue
		}
		out = append(out, f)
	}
	return out
}

// Models lists the simulated models.
func Models() []string {
	return []string{"a100-40gb", "a100-80gb", "a100-pcie-80gb", "h100-80gb", "h200-141gb"}
}

// UUID is the deterministic UUID of simulated GPU index of a model, the same
// in every process and for every GPU count, so one ConfigMap value selects
// the same GPU on a 1-GPU and an 8-GPU simulated node.
func UUID(model string, index int) string {
	return "GPU-" + uuidShape(fmt.Sprintf("nvinject-sim/%s/%d", model, index))
}

// uuidShape hashes seed into the shape of a UUID.
func uuidShape(seed string) string {
	h := sha256.Sum256([]byte(seed))
	h[6] = (h[6] & 0x0f) | 0x50 // version 5 shape, so it reads as a UUID
	h[8] = (h[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
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

	// procRoot is the /proc searched for processes holding a MIG
	// instance's access node.
	procRoot string

	log *slog.Logger

	mu     sync.Mutex
	regs   map[chan nvml.EventData]map[string]bool
	faults *faultTable
	// pins are the IDs the next create calls give (pin).
	pins map[any]uint32

	// stateFile is the SIMULATED MIG state the node follows (Follow);
	// specState is the --nvml value's layout, which holds without it.
	stateFile string
	specState State
	stateMu   sync.Mutex
	stateSeen fs.FileInfo
	stateGen  int
}

// Option configures a simulated Node.
type Option func(*Node)

// WithProcRoot sets the /proc in which processes holding a MIG instance's
// /dev/nvidia-caps node are found (default the host's; tests give a fake).
func WithProcRoot(dir string) Option { return func(n *Node) { n.procRoot = dir } }

// WithLogger sets where the node reports a state file it cannot follow
// (default slog's default).
func WithLogger(l *slog.Logger) Option { return func(n *Node) { n.log = l } }

// New builds the simulated node for spec, creating each GPU's MIG layout
// through NVML's calls. The spec comes from ParseSpec, which has checked
// that the layouts fit; New panics on one that does not.
func New(spec Spec, opts ...Option) *Node {
	cfgs := gpus.Multiple(spec.Count, models[spec.Model])
	srv := dgxa100.NewWithGPUs(cfgs...)
	srv.DriverVersion = spec.DriverVersion()
	srv.CudaDriverVersion, _ = CUDAVersionFor(srv.DriverVersion)
	n := &Node{spec: spec, server: srv, procRoot: simholders.Proc, log: slog.Default(), regs: map[chan nvml.EventData]map[string]bool{}, faults: &faultTable{byID: map[string]*deviceFaults{}}, pins: map[any]uint32{}}
	for _, o := range opts {
		o(n)
	}
	for i, d := range srv.Devices {
		dev := d.(*server.Device)
		dev.UUID = UUID(spec.uuidModel(), i)
		dev.PciBusID = BusID(i)
		n.wireDevice(dev)
		n.wireHealthQueries(dev)
		n.wireMIG(dev)
		if err := n.applyLayout(dev, i); err != nil {
			panic(fmt.Sprintf("sim.New(%s): %v; build the Spec with ParseSpec", spec, err))
		}
	}
	srv.EventSetCreateFunc = n.newEventSet
	n.specState = n.State()
	if n.stateFile != "" {
		// Discovery and the layout fingerprint both start by counting.
		count := srv.DeviceGetCountFunc
		srv.DeviceGetCountFunc = func() (int, nvml.Return) {
			if err := n.Follow(); err != nil {
				n.log.Error("SIMULATION: cannot follow the simulated MIG state file", "error", err.Error())
			}
			return count()
		}
	}
	return n
}

// applyLayout turns MIG mode on for a GPU the spec names and creates its
// instances at the placements plan chose.
func (n *Node) applyLayout(dev *server.Device, index int) error {
	names, on := n.spec.layout(index)
	if !on {
		return nil
	}
	dev.MigMode = nvml.DEVICE_MIG_ENABLE
	ps, at, err := plan(n.spec.Model, names)
	if err != nil {
		return err
	}
	for i, p := range ps {
		if _, _, err := create(dev, index, p, &at[i].at); err != nil {
			return err
		}
	}
	return nil
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
