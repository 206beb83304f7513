//go:build !nosim

package sim

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/nvinject/nvinject/shared/gpu/nvcaps"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim/simholders"
)

// ErrInUse is returned for a MIG instance a process holds: the simulated
// driver, as the real one, does not destroy it.
var ErrInUse = errors.New("in use")

// The simulated driver's MIG rules. go-nvml's mock keeps the profile and
// placement tables but creates whatever it is asked to; the simulation
// admits a GPU instance the way the driver does: its profile has instances
// left, one of the profile's placements is free, and the GPU has compute
// slices and memory eighths left. go-nvml's A100 tables place in memory
// slices and its H100/H200 tables in compute slices, so the two budgets
// catch what the placements alone miss (3g+3g+1g on an H100). IDs are the
// lowest free ones, as the driver reuses them.

// memoryEighths is what MIG divides a GPU's memory into.
const memoryEighths = 8

// profile is a MIG profile a simulated model offers: a GPU instance
// profile and the compute instance profile of the GI's one CI.
type profile struct {
	name   string
	gi, ci int
	giInfo nvml.GpuInstanceProfileInfo
	ciInfo nvml.ComputeInstanceProfileInfo
}

// full says whether the CI spans its GI, the shape nvidia-smi mig -cgi -C
// and mig-parted create.
func (p profile) full() bool { return p.ciInfo.SliceCount == p.giInfo.SliceCount }

// profilesOf lists a model's MIG profiles, named as discovery names them:
// GI profiles from the smallest, as nvidia-smi mig -lgip lists them, each
// with its CIs from the largest. Of two CI profiles with one name
// (1_SLICE and 1_SLICE_REV1) the first is kept.
func profilesOf(cfg gpus.Config) []profile {
	var out []profile
	seen := map[string]bool{}
	gis := cfg.MIGProfiles.GpuInstanceProfiles
	order := sortedKeys(gis)
	sort.SliceStable(order, func(a, b int) bool {
		pa, pb := gis[order[a]], gis[order[b]]
		if pa.SliceCount != pb.SliceCount {
			return pa.SliceCount < pb.SliceCount
		}
		return pa.MemorySizeMB < pb.MemorySizeMB
	})
	for _, gi := range order {
		giInfo := cfg.MIGProfiles.GpuInstanceProfiles[gi]
		cis := cfg.MIGProfiles.ComputeInstanceProfiles[gi]
		keys := sortedKeys(cis)
		sort.SliceStable(keys, func(a, b int) bool { return cis[keys[a]].SliceCount > cis[keys[b]].SliceCount })
		for _, ci := range keys {
			name, err := nvmlinv.MIGProfileName(gi, giInfo, cis[ci], cfg.MemoryMB<<20)
			if err != nil || seen[name] {
				continue
			}
			seen[name] = true
			out = append(out, profile{name: name, gi: gi, ci: ci, giInfo: giInfo, ciInfo: cis[ci]})
		}
	}
	return out
}

func sortedKeys[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	return keys
}

func findProfile(cfg gpus.Config, name string) (profile, bool) {
	for _, p := range profilesOf(cfg) {
		if p.name == name {
			return p, true
		}
	}
	return profile{}, false
}

// profileNames lists the names of a model's profiles whose CI spans the GI.
func profileNames(cfg gpus.Config) string {
	var names []string
	for _, p := range profilesOf(cfg) {
		if p.full() {
			names = append(names, p.name)
		}
	}
	return strings.Join(names, ", ")
}

// computeSlices is a model's compute slice count: its largest GI's.
func computeSlices(cfg gpus.Config) uint32 {
	var n uint32
	for _, p := range cfg.MIGProfiles.GpuInstanceProfiles {
		n = max(n, p.SliceCount)
	}
	return n
}

// placed is a GPU instance on a simulated GPU, or one being planned: its
// profile, placement and (once created) ID.
type placed struct {
	gi int
	at nvml.GpuInstancePlacement
	id int
}

// admits says whether a GI of profile gi at placement at fits beside have.
func admits(cfg gpus.Config, have []placed, gi int, at nvml.GpuInstancePlacement) bool {
	info := cfg.MIGProfiles.GpuInstanceProfiles[gi]
	total := cfg.MemoryMB << 20
	count, slices, eighths := uint32(0), info.SliceCount, nvmlinv.MIGMemoryEighths(uint64(info.MemorySizeMB), total)
	for _, h := range have {
		hi := cfg.MIGProfiles.GpuInstanceProfiles[h.gi]
		if h.gi == gi {
			count++
		}
		slices += hi.SliceCount
		eighths += nvmlinv.MIGMemoryEighths(uint64(hi.MemorySizeMB), total)
		if at.Start < h.at.Start+h.at.Size && h.at.Start < at.Start+at.Size {
			return false
		}
	}
	return count < info.InstanceCount && slices <= computeSlices(cfg) && eighths <= memoryEighths
}

// place finds placements for GIs of the profiles gis beside have, trying
// each profile's placements in table order; ok is false when none fit.
func place(cfg gpus.Config, have []placed, gis []int) ([]placed, bool) {
	if len(gis) == 0 {
		return nil, true
	}
	for _, at := range cfg.MIGProfiles.GpuInstancePlacements[gis[0]] {
		if !admits(cfg, have, gis[0], at) {
			continue
		}
		here := placed{gi: gis[0], at: at}
		if rest, ok := place(cfg, append(have[:len(have):len(have)], here), gis[1:]); ok {
			return append([]placed{here}, rest...), true
		}
	}
	return nil, false
}

// fitting lists the full-CI profiles that fit beside have.
func fitting(cfg gpus.Config, have []placed) string {
	var names []string
	for _, p := range profilesOf(cfg) {
		if _, ok := place(cfg, have, []int{p.gi}); ok && p.full() {
			names = append(names, p.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// plan resolves a layout's profile names and places them on an empty GPU
// of the model. The error says which profile is unknown or, for a layout
// that does not fit, the part that does and what else fits beside it.
func plan(model string, names []string) ([]profile, []placed, error) {
	cfg := models[model]
	ps := make([]profile, len(names))
	gis := make([]int, len(names))
	for i, name := range names {
		p, ok := findProfile(cfg, name)
		if !ok {
			return nil, nil, fmt.Errorf("%q is not a MIG profile of %s; its profiles: %s (or <C>c.<profile> for a compute instance of C slices)", name, model, profileNames(cfg))
		}
		ps[i], gis[i] = p, p.gi
	}
	at, ok := place(cfg, nil, gis)
	if ok {
		return ps, at, nil
	}
	// The longest head of the layout that fits, and what fits beside it.
	n := 0
	for n < len(gis) {
		if _, ok := place(cfg, nil, gis[:n+1]); !ok {
			break
		}
		n++
	}
	head, _ := place(cfg, nil, gis[:n])
	return nil, nil, fmt.Errorf("%s does not fit a simulated %s GPU (%d compute slices, %d memory eighths): after %s there is no room for %s; what fits beside %s: %s",
		renderProfiles(names), model, computeSlices(cfg), memoryEighths, orNothing(names[:n]), names[n], orNothing(names[:n]), fitting(cfg, head))
}

func orNothing(names []string) string {
	if len(names) == 0 {
		return "nothing"
	}
	return renderProfiles(names)
}

// wireMIG gives a simulated GPU what the mock lacks for MIG: the MIG
// device handles, lookups by ID, and creation by the simulated driver's
// rules.
func (n *Node) wireMIG(dev *server.Device) {
	slots := int(computeSlices(dev.Config))
	dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return slots, nvml.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= slots {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		migs := migHandles(dev)
		if i >= len(migs) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return migs[i], nvml.SUCCESS
	}
	dev.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		dev.RLock()
		defer dev.RUnlock()
		for gi := range dev.GpuInstances {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	dev.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		return n.createGI(dev, info, nil)
	}
	dev.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		return n.createGI(dev, info, at)
	}
}

func (n *Node) createGI(dev *server.Device, info *nvml.GpuInstanceProfileInfo, at *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	dev.Lock()
	defer dev.Unlock()
	if dev.MigMode != nvml.DEVICE_MIG_ENABLE {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	cfg := dev.Config
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if _, ok := cfg.MIGProfiles.GpuInstanceProfiles[int(info.Id)]; !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	var have []placed
	ids := map[uint32]bool{}
	for gi := range dev.GpuInstances {
		have = append(have, placed{gi: int(gi.Info.ProfileId), at: gi.Info.Placement})
		ids[gi.Info.Id] = true
	}
	var where nvml.GpuInstancePlacement
	if at != nil {
		valid := false
		for _, p := range cfg.MIGProfiles.GpuInstancePlacements[int(info.Id)] {
			valid = valid || p == *at
		}
		if !valid {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if !admits(cfg, have, int(info.Id), *at) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		where = *at
	} else {
		got, ok := place(cfg, have, []int{int(info.Id)})
		if !ok {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		where = got[0].at
	}
	id, ok := n.nextID(dev, ids)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{Device: dev, Id: id, ProfileId: info.Id, Placement: where}, cfg.MIGProfiles)
	n.wireGI(gi)
	dev.GpuInstances[gi] = struct{}{}
	return gi, nvml.SUCCESS
}

func lowestFree(used map[uint32]bool) uint32 {
	id := uint32(0)
	for used[id] {
		id++
	}
	return id
}

// wireGI makes a GPU instance behave as the driver's: CIs fit its slices,
// it cannot be destroyed while it holds any or while a process has its
// access node open, and neither can a CI whose access node is open
// (NVML_ERROR_IN_USE).
func (n *Node) wireGI(gi *server.GpuInstance) {
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		gi.Lock()
		defer gi.Unlock()
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		prof, ok := gi.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)][int(info.Id)]
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		slices := prof.SliceCount
		count := uint32(0)
		ids := map[uint32]bool{}
		for ci := range gi.ComputeInstances {
			slices += gi.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)][int(ci.Info.ProfileId)].SliceCount
			if ci.Info.ProfileId == info.Id {
				count++
			}
			ids[ci.Info.Id] = true
		}
		if count >= prof.InstanceCount || slices > gi.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)].SliceCount {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		id, ok := n.nextID(gi, ids)
		if !ok {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		ci := server.NewComputeInstanceFromInfo(nvml.ComputeInstanceInfo{Device: gi.Info.Device, GpuInstance: gi, Id: id, ProfileId: info.Id})
		n.wireCI(ci)
		gi.ComputeInstances[ci] = struct{}{}
		return ci, nvml.SUCCESS
	}
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		gi.RLock()
		defer gi.RUnlock()
		for ci := range gi.ComputeInstances {
			if int(ci.Info.Id) == id {
				return ci, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	gi.DestroyFunc = func() nvml.Return {
		dev := gi.Info.Device.(*server.Device)
		dev.Lock()
		defer dev.Unlock()
		gi.RLock()
		busy := len(gi.ComputeInstances) > 0
		gi.RUnlock()
		if _, ok := dev.GpuInstances[gi]; !ok {
			return nvml.ERROR_NOT_FOUND
		}
		if busy || n.held(giMinor(dev.Minor, int(gi.Info.Id))) {
			return nvml.ERROR_IN_USE
		}
		delete(dev.GpuInstances, gi)
		return nvml.SUCCESS
	}
}

// wireCI refuses destroying a compute instance whose access node a
// process holds open, as the driver does.
func (n *Node) wireCI(ci *server.ComputeInstance) {
	ci.DestroyFunc = func() nvml.Return {
		gi := ci.Info.GpuInstance.(*server.GpuInstance)
		dev := gi.Info.Device.(*server.Device)
		if n.held(ciMinor(dev.Minor, int(gi.Info.Id), int(ci.Info.Id))) {
			return nvml.ERROR_IN_USE
		}
		gi.Lock()
		defer gi.Unlock()
		if _, ok := gi.ComputeInstances[ci]; !ok {
			return nvml.ERROR_NOT_FOUND
		}
		delete(gi.ComputeInstances, ci)
		return nvml.SUCCESS
	}
}

// held says whether a process under the proc root has the capability
// node of minor open; a /proc that cannot be read holds nothing.
func (n *Node) held(minor int) bool {
	pids, err := simholders.Holders(n.procRoot, CapsMajor, int64(minor))
	return err == nil && len(pids) > 0
}

// instance is one CI of a GI, as a MIG device's handle and procfs files
// need it.
type instance struct {
	gi     *server.GpuInstance
	giID   int
	ciID   int
	memory uint64
}

// instances lists a GPU's CIs in GI then CI order.
func instances(dev *server.Device) []instance {
	dev.RLock()
	defer dev.RUnlock()
	var out []instance
	for gi := range dev.GpuInstances {
		mem := uint64(dev.Config.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)].MemorySizeMB) << 20
		gi.RLock()
		for ci := range gi.ComputeInstances {
			out = append(out, instance{gi: gi, giID: int(gi.Info.Id), ciID: int(ci.Info.Id), memory: mem})
		}
		gi.RUnlock()
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].giID != out[b].giID {
			return out[a].giID < out[b].giID
		}
		return out[a].ciID < out[b].ciID
	})
	return out
}

// migHandles are a GPU's MIG device handles, in GI then CI order.
func migHandles(dev *server.Device) []nvml.Device {
	var out []nvml.Device
	for _, in := range instances(dev) {
		m := &mock.Device{}
		uuid, giID, ciID, mem := MIGUUID(dev.UUID, in.giID, in.ciID), in.giID, in.ciID, in.memory
		m.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
		m.GetUUIDFunc = func() (string, nvml.Return) { return uuid, nvml.SUCCESS }
		m.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return giID, nvml.SUCCESS }
		m.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return ciID, nvml.SUCCESS }
		m.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: mem, Free: mem}, nvml.SUCCESS }
		m.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS }
		out = append(out, m)
	}
	return out
}

// MIGUUID is the deterministic UUID of the MIG device of compute instance
// ci in GPU instance gi on the simulated GPU parent.
func MIGUUID(parent string, gi, ci int) string {
	return "MIG-" + uuidShape(fmt.Sprintf("nvinject-sim/mig/%s/%d/%d", parent, gi, ci))
}

// create makes a GI of p (at a placement, or where the driver puts it)
// and its one CI through NVML's calls, as nvidia-smi mig -cgi -C does.
func create(dev *server.Device, index int, p profile, at *nvml.GpuInstancePlacement) (gi, ci int, err error) {
	giInfo, ret := dev.GetGpuInstanceProfileInfo(p.gi)
	if ret != nvml.SUCCESS {
		return 0, 0, fmt.Errorf("simulated GPU %d: read GPU instance profile %s: %s", index, p.name, nvml.ErrorString(ret))
	}
	var g nvml.GpuInstance
	if at != nil {
		g, ret = dev.CreateGpuInstanceWithPlacement(&giInfo, at)
	} else {
		g, ret = dev.CreateGpuInstance(&giInfo)
	}
	if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
		have := placements(dev)
		return 0, 0, fmt.Errorf("simulated GPU %d has no room for %s beside its GPU instances; what fits: %s; destroy one first", index, p.name, fitting(dev.Config, have))
	}
	if ret != nvml.SUCCESS {
		return 0, 0, fmt.Errorf("simulated GPU %d: create GPU instance %s: %s", index, p.name, nvml.ErrorString(ret))
	}
	ciInfo, ret := g.GetComputeInstanceProfileInfo(p.ci, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	var c nvml.ComputeInstance
	if ret == nvml.SUCCESS {
		c, ret = g.CreateComputeInstance(&ciInfo)
	}
	if ret != nvml.SUCCESS {
		_ = g.Destroy()
		return 0, 0, fmt.Errorf("simulated GPU %d: create the compute instance of %s: %s", index, p.name, nvml.ErrorString(ret))
	}
	gInfo, _ := g.GetInfo()
	cInfo, _ := c.GetInfo()
	return int(gInfo.Id), int(cInfo.Id), nil
}

// placements lists a GPU's GPU instances.
func placements(dev *server.Device) []placed {
	dev.RLock()
	defer dev.RUnlock()
	var have []placed
	for gi := range dev.GpuInstances {
		have = append(have, placed{gi: int(gi.Info.ProfileId), at: gi.Info.Placement, id: int(gi.Info.Id)})
	}
	return have
}

// CreateGPUInstance changes the MIG layout of a running simulated node:
// it creates a GPU instance of profile ("1g.10gb", "1c.3g.40gb") on
// simulated GPU index, and its one compute instance, through NVML's calls
// as nvidia-smi mig -cgi PROFILE -C does, at the first free placement. It
// returns the GI and CI IDs.
func (n *Node) CreateGPUInstance(index int, profile string) (gi, ci int, err error) {
	dev, err := n.migGPU(index)
	if err != nil {
		return 0, 0, err
	}
	p, ok := findProfile(dev.Config, profile)
	if !ok {
		return 0, 0, fmt.Errorf("%q is not a MIG profile of simulated GPU %d (%s); its profiles: %s", profile, index, n.spec.Model, profileNames(dev.Config))
	}
	return create(dev, index, p, nil)
}

// DestroyGPUInstance destroys GPU instance gi on simulated GPU index and
// its compute instances through NVML's calls, as nvidia-smi mig -dci and
// -dgi do.
func (n *Node) DestroyGPUInstance(index, gi int) error {
	dev, err := n.migGPU(index)
	if err != nil {
		return err
	}
	g, ret := dev.GetGpuInstanceById(gi)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("simulated GPU %d has no GPU instance %d: %s", index, gi, nvml.ErrorString(ret))
	}
	for _, in := range instances(dev) {
		if in.giID != gi {
			continue
		}
		c, ret := g.GetComputeInstanceById(in.ciID)
		if ret == nvml.SUCCESS {
			ret = c.Destroy()
		}
		if ret == nvml.ERROR_IN_USE {
			return fmt.Errorf("simulated GPU %d: compute instance %d of GPU instance %d is in use by a process (its %s is open); stop it first: %w", index, in.ciID, gi, nvcaps.ComputeInstanceFile(dev.Minor, gi, in.ciID), ErrInUse)
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("simulated GPU %d: destroy compute instance %d of GPU instance %d: %s", index, in.ciID, gi, nvml.ErrorString(ret))
		}
	}
	if ret := g.Destroy(); ret == nvml.ERROR_IN_USE {
		return fmt.Errorf("simulated GPU %d: GPU instance %d is in use by a process; stop it first: %w", index, gi, ErrInUse)
	} else if ret != nvml.SUCCESS {
		return fmt.Errorf("simulated GPU %d: destroy GPU instance %d: %s", index, gi, nvml.ErrorString(ret))
	}
	return nil
}

func (n *Node) migGPU(index int) (*server.Device, error) {
	if index < 0 || index >= len(n.server.Devices) {
		return nil, fmt.Errorf("simulated GPU %d does not exist; the node has GPUs 0 to %d", index, len(n.server.Devices)-1)
	}
	dev := n.server.Devices[index].(*server.Device)
	if mode, _, _ := dev.GetMigMode(); mode != nvml.DEVICE_MIG_ENABLE {
		return nil, fmt.Errorf("simulated GPU %d has MIG mode off; turn it on with mig=%d in --nvml", index, index)
	}
	return dev, nil
}
