//go:build !nosim

package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// StateFile is the SIMULATED driver's MIG state inside a driver root: the
// MIG instances every process that opens the simulated node from one
// --nvml value follows. A real driver keeps its MIG layout in the kernel,
// shared by every NVML client; each nvinject daemon opens its own
// in-process simulation, so the simulation shares its layout through this
// file instead. sim-mig (e2e/cmd) writes it; absent, the --nvml
// value's layout holds.
const StateFile = "usr/share/nvinject/simulated-mig.json"

// stateNote is the file's first field, so a person reading it knows what
// it is.
const stateNote = "SIMULATED MIG layout of nvinject's simulated GPUs (shared/gpu/sim), written by sim-mig; no real GPU reads it"

// State is the SIMULATED MIG layout a state file records: each MIG GPU's
// instances with everything that reproduces their IDs, and so their
// UUIDs (MIGUUID), in another process.
type State struct {
	Simulation string `json:"simulation"`
	// Spec is the --nvml value of the node that wrote it; a node of another
	// model or GPU count refuses the file.
	Spec string `json:"spec"`
	// Generation counts the writes.
	Generation int        `json:"generation"`
	GPUs       []GPUState `json:"gpus"`
}

// GPUState is one MIG GPU's instances; a MIG GPU the file does not list
// has none.
type GPUState struct {
	Index int `json:"index"`
	// UUID is for the reader; the index names the GPU.
	UUID         string    `json:"uuid"`
	GPUInstances []GIState `json:"gpuInstances"`
}

// GIState is a GPU instance: its profile's name (a full-CI profile, such
// as 3g.40gb), its ID and its placement.
type GIState struct {
	ID               int           `json:"id"`
	Profile          string        `json:"profile"`
	Placement        PlacementJSON `json:"placement"`
	ComputeInstances []CIState     `json:"computeInstances"`
}

// PlacementJSON is a GPU instance's placement, as NVML's.
type PlacementJSON struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

// CIState is a compute instance: its profile's name (3g.40gb for one
// spanning a 3g GI, 1c.3g.40gb for a slice of it) and its ID.
type CIState struct {
	ID      int    `json:"id"`
	Profile string `json:"profile"`
	// UUID is the MIG device's, for the reader.
	UUID string `json:"uuid"`
}

// WithStateFile makes the node follow the SIMULATED MIG state file path
// (the driver root's StateFile): every DeviceGetCount, the first call of
// a discovery or a layout read, reconciles the node's instances to the
// file when it changed.
func WithStateFile(path string) Option { return func(n *Node) { n.stateFile = path } }

// State returns the node's MIG instances now.
func (n *Node) State() State {
	s := State{Simulation: stateNote, Spec: n.spec.String()}
	for i, d := range n.server.Devices {
		dev := d.(*server.Device)
		if mode, _, _ := dev.GetMigMode(); mode != nvml.DEVICE_MIG_ENABLE {
			continue
		}
		g := GPUState{Index: i, UUID: dev.UUID, GPUInstances: []GIState{}}
		dev.RLock()
		for gi := range dev.GpuInstances {
			st := GIState{ID: int(gi.Info.Id), Profile: giName(dev.Config, int(gi.Info.ProfileId)),
				Placement: PlacementJSON{Start: gi.Info.Placement.Start, Size: gi.Info.Placement.Size}, ComputeInstances: []CIState{}}
			gi.RLock()
			for ci := range gi.ComputeInstances {
				st.ComputeInstances = append(st.ComputeInstances, CIState{ID: int(ci.Info.Id), Profile: ciName(dev.Config, int(gi.Info.ProfileId), int(ci.Info.ProfileId)),
					UUID: MIGUUID(dev.UUID, int(gi.Info.Id), int(ci.Info.Id))})
			}
			gi.RUnlock()
			sort.Slice(st.ComputeInstances, func(a, b int) bool { return st.ComputeInstances[a].ID < st.ComputeInstances[b].ID })
			g.GPUInstances = append(g.GPUInstances, st)
		}
		dev.RUnlock()
		sort.Slice(g.GPUInstances, func(a, b int) bool { return g.GPUInstances[a].ID < g.GPUInstances[b].ID })
		s.GPUs = append(s.GPUs, g)
	}
	return s
}

// giName names GPU instance profile gi of a model by its full-CI profile.
func giName(cfg gpus.Config, gi int) string {
	for _, p := range profilesOf(cfg) {
		if p.gi == gi && p.full() {
			return p.name
		}
	}
	return fmt.Sprintf("GPU instance profile %d", gi)
}

// ciName names compute instance profile ci of GPU instance profile gi.
func ciName(cfg gpus.Config, gi, ci int) string {
	for _, p := range profilesOf(cfg) {
		if p.gi == gi && p.ci == ci {
			return p.name
		}
	}
	return fmt.Sprintf("compute instance profile %d of GPU instance profile %d", ci, gi)
}

// Follow reconciles the node's MIG instances to its state file when the
// file changed since the last call, which otherwise costs one stat: to
// the file's instances, or to the --nvml value's layout once the file is
// gone. A file that cannot be read or does not fit changes nothing and is
// reported once; a change the driver refuses halfway (a process holds an
// instance the file no longer lists) is reported and tried again at the
// next call.
func (n *Node) Follow() error {
	if n.stateFile == "" {
		return nil
	}
	n.stateMu.Lock()
	defer n.stateMu.Unlock()
	fi, err := os.Stat(n.stateFile)
	if errors.Is(err, fs.ErrNotExist) {
		fi, err = nil, nil
	}
	if err != nil {
		return fmt.Errorf("SIMULATION: read the simulated MIG state file: %w; make it readable or remove it", err)
	}
	if sameFile(n.stateSeen, fi) {
		return nil
	}
	want := n.specState
	if fi != nil {
		if want, err = n.readState(); err == nil {
			err = n.fits(want)
		}
		if err != nil {
			n.stateSeen = fi
			return fmt.Errorf("SIMULATION: simulated MIG state file %s: %w; fix it with sim-mig or remove it (the --nvml value's layout then holds); the node keeps its MIG layout", n.stateFile, err)
		}
	}
	if err := n.reconcile(want); err != nil {
		return fmt.Errorf("SIMULATION: the simulated MIG layout is applied in part, from %s (generation %d): %w; it is tried again at the next read", n.stateFile, want.Generation, err)
	}
	n.stateSeen, n.stateGen = fi, want.Generation
	return nil
}

// sameFile says whether two stats (nil: absent) are of one unchanged file;
// a rename over it is a new file.
func sameFile(a, b fs.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}

// readState reads the state file and checks it is for this node's GPUs.
func (n *Node) readState() (State, error) {
	data, err := os.ReadFile(n.stateFile)
	if err != nil {
		return State{}, err
	}
	var s State
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return State{}, fmt.Errorf("not a simulated MIG state (%w)", err)
	}
	spec, err := ParseSpec(s.Spec)
	if err != nil {
		return State{}, fmt.Errorf("its spec: %w", err)
	}
	if spec.Model != n.spec.Model || spec.Count != n.spec.Count {
		return State{}, fmt.Errorf("it is for %s*%d, this node is %s*%d", spec.Model, spec.Count, n.spec.Model, n.spec.Count)
	}
	return s, nil
}

// fits applies want to an empty simulated node of the same GPUs, so a
// layout the driver would refuse is found before this node changes.
func (n *Node) fits(want State) error {
	scratch := Spec{Model: n.spec.Model, Count: n.spec.Count}
	var on []int
	for i := range n.spec.Count {
		if _, ok := n.spec.layout(i); ok {
			on = append(on, i)
		}
	}
	if len(on) > 0 {
		scratch.MIG = []MIGLayout{{GPUs: on}}
	}
	return New(scratch).reconcile(want)
}

// reconcile makes the node's MIG instances want's through NVML's calls:
// first it destroys what want does not list, then it creates what is
// missing at its recorded placement with its recorded IDs.
func (n *Node) reconcile(want State) error {
	byIndex := map[int][]GIState{}
	for _, g := range want.GPUs {
		if _, dup := byIndex[g.Index]; dup {
			return fmt.Errorf("GPU %d is listed twice", g.Index)
		}
		if _, err := n.migGPU(g.Index); err != nil {
			return err
		}
		byIndex[g.Index] = g.GPUInstances
	}
	for i, d := range n.server.Devices {
		dev := d.(*server.Device)
		if mode, _, _ := dev.GetMigMode(); mode != nvml.DEVICE_MIG_ENABLE {
			continue
		}
		if err := n.reconcileGPU(dev, i, byIndex[i]); err != nil {
			return fmt.Errorf("simulated GPU %d: %w", i, err)
		}
	}
	return nil
}

// wantGI is a recorded GPU instance with its profiles resolved.
type wantGI struct {
	GIState
	gi  int
	cis map[int]int // CI ID to CI profile
}

// maxGIs and maxCIs are the IDs the driver's capability table has room
// for (nv-caps.c): 15 GPU instances a GPU, 8 compute instances each.
const (
	maxGIs = capsPerGPU / capsPerGI
	maxCIs = capsPerGI - 1
)

func resolve(cfg gpus.Config, model string, gis []GIState) ([]wantGI, error) {
	var out []wantGI
	seen := map[int]bool{}
	for _, g := range gis {
		if g.ID < 0 || g.ID >= maxGIs || seen[g.ID] {
			return nil, fmt.Errorf("GPU instance ID %d is repeated or not from 0 to %d", g.ID, maxGIs-1)
		}
		seen[g.ID] = true
		p, ok := findProfile(cfg, g.Profile)
		if !ok || !p.full() {
			return nil, fmt.Errorf("GPU instance %d: %q is not a GPU instance profile of %s; its profiles: %s", g.ID, g.Profile, model, profileNames(cfg))
		}
		w := wantGI{GIState: g, gi: p.gi, cis: map[int]int{}}
		for _, c := range g.ComputeInstances {
			cp, ok := findProfile(cfg, c.Profile)
			if !ok || cp.gi != p.gi {
				return nil, fmt.Errorf("GPU instance %d: %q is not a compute instance profile of a %s GPU instance", g.ID, c.Profile, g.Profile)
			}
			if _, dup := w.cis[c.ID]; dup || c.ID < 0 || c.ID >= maxCIs {
				return nil, fmt.Errorf("GPU instance %d: compute instance ID %d is repeated or not from 0 to %d", g.ID, c.ID, maxCIs-1)
			}
			w.cis[c.ID] = cp.ci
		}
		out = append(out, w)
	}
	return out, nil
}

func (n *Node) reconcileGPU(dev *server.Device, index int, gis []GIState) error {
	want, err := resolve(dev.Config, n.spec.Model, gis)
	if err != nil {
		return err
	}
	byID := map[int]wantGI{}
	for _, w := range want {
		byID[w.ID] = w
	}
	dev.RLock()
	var have []*server.GpuInstance
	for gi := range dev.GpuInstances {
		have = append(have, gi)
	}
	dev.RUnlock()
	for _, g := range have {
		w, keep := byID[int(g.Info.Id)]
		keep = keep && w.gi == int(g.Info.ProfileId) && w.Placement == PlacementJSON{Start: g.Info.Placement.Start, Size: g.Info.Placement.Size}
		if err := n.trimGI(index, g, w, keep); err != nil {
			return err
		}
	}
	for _, w := range want {
		if err := n.createRecorded(dev, w); err != nil {
			return err
		}
	}
	return nil
}

// trimGI destroys g's compute instances that w does not list (all of
// them unless keep) and, unless keep, g.
func (n *Node) trimGI(index int, g *server.GpuInstance, w wantGI, keep bool) error {
	g.RLock()
	var cis []*server.ComputeInstance
	for ci := range g.ComputeInstances {
		if p, ok := w.cis[int(ci.Info.Id)]; !keep || !ok || p != int(ci.Info.ProfileId) {
			cis = append(cis, ci)
		}
	}
	g.RUnlock()
	for _, ci := range cis {
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			return fmt.Errorf("destroy compute instance %d of GPU instance %d: %s", ci.Info.Id, g.Info.Id, inUse(ret))
		}
	}
	if keep {
		return nil
	}
	if ret := g.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("destroy GPU instance %d: %s", g.Info.Id, inUse(ret))
	}
	return nil
}

func inUse(ret nvml.Return) string {
	if ret == nvml.ERROR_IN_USE {
		return "in use by a process (its /dev/nvidia-caps node is open); stop it first"
	}
	return nvml.ErrorString(ret)
}

// createRecorded creates w and its compute instances where missing, with
// w's placement and IDs.
func (n *Node) createRecorded(dev *server.Device, w wantGI) error {
	g, ret := dev.GetGpuInstanceById(w.ID)
	if ret == nvml.ERROR_NOT_FOUND {
		info, ret := dev.GetGpuInstanceProfileInfo(w.gi)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("read GPU instance profile %s: %s", w.Profile, nvml.ErrorString(ret))
		}
		at := nvml.GpuInstancePlacement{Start: w.Placement.Start, Size: w.Placement.Size}
		unpin := n.pin(dev, w.ID)
		g, ret = dev.CreateGpuInstanceWithPlacement(&info, &at)
		unpin()
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_INSUFFICIENT_RESOURCES:
			return fmt.Errorf("GPU instance %d (%s) at placement %d+%d overlaps or exceeds the others; what fits beside them: %s", w.ID, w.Profile, at.Start, at.Size, fitting(dev.Config, placements(dev)))
		case nvml.ERROR_INVALID_ARGUMENT:
			return fmt.Errorf("GPU instance %d (%s): placement %d+%d is not one of the profile's (%s)", w.ID, w.Profile, at.Start, at.Size, placementList(dev.Config, w.gi))
		default:
			return fmt.Errorf("create GPU instance %d (%s): %s", w.ID, w.Profile, nvml.ErrorString(ret))
		}
	} else if ret != nvml.SUCCESS {
		return fmt.Errorf("look up GPU instance %d: %s", w.ID, nvml.ErrorString(ret))
	}
	for _, c := range w.ComputeInstances {
		if _, ret := g.GetComputeInstanceById(c.ID); ret == nvml.SUCCESS {
			continue
		}
		info, ret := g.GetComputeInstanceProfileInfo(w.cis[c.ID], nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS {
			unpin := n.pin(g, c.ID)
			_, ret = g.CreateComputeInstance(&info)
			unpin()
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("create compute instance %d (%s) of GPU instance %d: %s; the GPU instance's compute instances exceed its slices", c.ID, c.Profile, w.ID, nvml.ErrorString(ret))
		}
	}
	return nil
}

func placementList(cfg gpus.Config, gi int) string {
	var out []string
	for _, at := range cfg.MIGProfiles.GpuInstancePlacements[gi] {
		out = append(out, fmt.Sprintf("%d+%d", at.Start, at.Size))
	}
	return strings.Join(out, ", ")
}

// pin makes the next create call for key (a GPU, for its GPU instance, or
// a GPU instance, for its compute instance) give id rather than the
// lowest free ID: NVML's create calls take no ID, and following a state
// file must reproduce the recorded ones. Follow, the only pinner, holds
// stateMu.
func (n *Node) pin(key any, id int) (unpin func()) {
	n.mu.Lock()
	n.pins[key] = uint32(id)
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		delete(n.pins, key)
		n.mu.Unlock()
	}
}

// nextID is the ID a create call for key gives beside used: the pinned
// one, or the lowest free. ok is false for a pinned ID in use.
func (n *Node) nextID(key any, used map[uint32]bool) (id uint32, ok bool) {
	n.mu.Lock()
	want, pinned := n.pins[key]
	n.mu.Unlock()
	if !pinned {
		return lowestFree(used), true
	}
	return want, !used[want]
}

// SaveState writes the node's MIG instances to its state file as the next
// generation, atomically (a temporary file renamed over it): a node
// following the file reads the old layout or the new one, never a mix.
func (n *Node) SaveState() (State, error) {
	if n.stateFile == "" {
		return State{}, errors.New("SIMULATION: this simulated node has no MIG state file; open it WithStateFile")
	}
	n.stateMu.Lock()
	defer n.stateMu.Unlock()
	s := n.State()
	s.Generation = n.stateGen + 1
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return State{}, err
	}
	dir := filepath.Dir(n.stateFile)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return State{}, fmt.Errorf("create the directory of the simulated MIG state file: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".simulated-mig-*.json")
	if err != nil {
		return State{}, fmt.Errorf("write the simulated MIG state file: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.Write(append(data, '\n'))
	if err := errors.Join(werr, tmp.Chmod(0o644), tmp.Close()); err != nil {
		return State{}, fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), n.stateFile); err != nil {
		return State{}, fmt.Errorf("replace the simulated MIG state file: %w", err)
	}
	fi, err := os.Stat(n.stateFile)
	if err != nil {
		return State{}, err
	}
	n.stateSeen, n.stateGen = fi, s.Generation
	return s, nil
}
