// Package verify checks that the GPUs a container will get are exactly the
// ones allocated to it: whole GPUs by device node (major 195, minor N), MIG
// devices by their parent's node and their GPU and compute instance access
// nodes (/dev/nvidia-caps), by the UUID-naming environment, and optionally
// by kubelet's own record.
package verify

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// EnvUUIDPrefix is the variable prefix nvinject's CDI specs use to name the
// UUID behind each GPU node: NVINJECT_GPU_UUID_<minor>=<uuid>.
const EnvUUIDPrefix = contract.EnvUUIDPrefix

// EnvMIGUUIDPrefix names each MIG device by its CI access node's minor:
// NVINJECT_MIG_UUID_<minor>=<MIG uuid>.
const EnvMIGUUIDPrefix = contract.EnvMIGUUIDPrefix

// Reason classifies a mismatch for metrics and logs.
type Reason string

// Mismatch reasons.
const (
	ReasonUnknownUUID Reason = "unknown-uuid"
	ReasonStaleSpec   Reason = "stale-spec"
	ReasonMissingGPU  Reason = "missing-gpu"
	ReasonForeignGPU  Reason = "foreign-gpu"
	// ReasonForeignSlice: a /dev/nvidia-caps node that is no allocated MIG
	// device's (another slice's, the MIG config or monitor node).
	ReasonForeignSlice Reason = "foreign-slice"
	// ReasonMissingSlice: an allocated MIG device lacks its parent's node
	// or one of its access nodes.
	ReasonMissingSlice Reason = "missing-slice"
	ReasonEnv          Reason = "env-mismatch"
	ReasonKubelet      Reason = "podresources-mismatch"
)

// MismatchError says what was expected and what was found.
type MismatchError struct {
	Reason   Reason
	What     string
	Expected []string
	Found    []string
}

func (e *MismatchError) Error() string {
	return contract.Bound(fmt.Errorf("GPU check failed (%s): %s: expected %s, found %s", e.Reason, e.What, contract.List(e.Expected), contract.List(e.Found))).Error()
}

// GPU is one allocated unit: a whole GPU, its UUID and the minor of its
// /dev/nvidiaN; or a MIG device (MIG set), its MIG UUID and the minor of
// its parent's /dev/nvidiaN.
type GPU struct {
	UUID  string
	Minor int64
	MIG   MIG
}

// MIG is a MIG device as its CDI device describes it: the access nodes
// granting its GPU instance and compute instance, and its CDI annotations'
// parent UUID, parent index and profile ("" when not annotated).
type MIG struct {
	GI, CI     Node
	ParentUUID string
	GPUIndex   string
	Profile    string
}

// IsMIG reports whether g is a MIG device.
func (g GPU) IsMIG() bool { return g.MIG.CI.Path != "" }

// Node is a device node as the container will have it.
type Node struct {
	Path         string
	Type         string
	Major, Minor int64
}

// IsGPU reports whether n is a GPU node (not nvidiactl or modeset).
func (n Node) IsGPU() bool {
	return n.Type == "c" && n.Major == gpu.NVIDIAMajor && n.Minor < gpu.ModesetMinor
}

// IsCaps reports whether n is a MIG capability node, by its path under
// /dev/nvidia-caps (a node's or a bind mount's source): the driver picks
// the major at load time. IsGPU nodes are not.
func (n Node) IsCaps() bool {
	return n.Type == "c" && !n.IsGPU() && strings.Contains(n.Path, contract.CapsDir+"/")
}

// caps reports whether n reaches a MIG capability: by its path, or by its
// numbers when the caps major is known (a device cgroup rule).
func (n Node) caps(majors map[int64]bool) bool {
	return n.IsCaps() || (n.Type == "c" && !n.IsGPU() && majors[n.Major])
}

// FromEdits derives the units a CDI device stands for from its own edits
// (and annotations): each GPU node (195:N) named by NVINJECT_GPU_UUID_N is
// a whole GPU; each caps node named by NVINJECT_MIG_UUID_M is a MIG
// device's CI access node, with its GI access node and its parent's GPU
// node before it, as the generator orders them. name is the device's
// qualified name; when it names a UUID, the device must be exactly that
// GPU or MIG device.
func FromEdits(name string, nodes []Node, env []string, ann map[string]string) ([]GPU, error) {
	uuids, migs := UUIDEnv(env), MIGUUIDEnv(env)
	var out []GPU
	var parent, gi *Node
	giUsed := true
	parents := map[int64]bool{}
	for i := range nodes {
		n := &nodes[i]
		switch {
		case n.IsGPU():
			if u, ok := uuids[n.Minor]; ok {
				out = append(out, GPU{UUID: u, Minor: n.Minor})
			}
			parent = n
		case n.IsCaps():
			u, ok := migs[n.Minor]
			if !ok {
				if !giUsed {
					return nil, unnamedCaps(name, *gi, env)
				}
				gi, giUsed = n, false
				continue
			}
			if parent == nil || gi == nil {
				return nil, &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("CDI device %s gives %s, the CI access node of %s, without its parent's /dev/nvidiaN and GI access node before it; regenerate the spec with nvinject", name, n.Path, u),
					Expected: []string{"/dev/nvidiaN", contract.CapsDir + "/nvidia-capN", n.Path}, Found: paths(nodes)}
			}
			if w, whole := uuids[parent.Minor]; whole {
				return nil, &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("CDI device %s names %s, the parent of MIG device %s, as whole GPU %s; regenerate the spec with nvinject", name, parent.Path, u, w),
					Expected: []string{pair(EnvMIGUUIDPrefix, n.Minor, u)}, Found: []string{pair(EnvUUIDPrefix, parent.Minor, w)}}
			}
			out = append(out, GPU{UUID: u, Minor: parent.Minor, MIG: MIG{GI: *gi, CI: *n,
				ParentUUID: ann[contract.MIGParentAnnotation], GPUIndex: ann[contract.GPUIndexAnnotation], Profile: ann[contract.MIGProfileAnnotation]}})
			parents[parent.Minor], giUsed = true, true
		}
	}
	if !giUsed {
		return nil, unnamedCaps(name, *gi, env)
	}
	for _, n := range nodes {
		if _, ok := uuids[n.Minor]; n.IsGPU() && !ok && !parents[n.Minor] {
			return nil, &MismatchError{Reason: ReasonUnknownUUID, What: fmt.Sprintf("CDI device %s gives %s (195:%d) but no %s%d naming its UUID; regenerate the spec with nvinject", name, n.Path, n.Minor, EnvUUIDPrefix, n.Minor),
				Expected: []string{EnvUUIDPrefix + strconv.FormatInt(n.Minor, 10)}, Found: env}
		}
	}
	if _, dev, ok := strings.Cut(name, "="); ok && (strings.HasPrefix(dev, "GPU-") || strings.HasPrefix(dev, "MIG-")) {
		if len(out) != 1 || out[0].UUID != dev || out[0].IsMIG() != strings.HasPrefix(dev, "MIG-") {
			return nil, &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("CDI device %s does not describe the GPU it is named after; regenerate the spec", name),
				Expected: []string{dev}, Found: uuidsOf(out)}
		}
	}
	return out, nil
}

// unnamedCaps: a GI access node must be followed by a CI access node that
// an NVINJECT_MIG_UUID_ variable names.
func unnamedCaps(name string, n Node, env []string) error {
	return &MismatchError{Reason: ReasonUnknownUUID, What: fmt.Sprintf("CDI device %s gives %s but no MIG device's CI access node named by %s* after it; regenerate the spec with nvinject", name, n.Path, EnvMIGUUIDPrefix),
		Expected: []string{EnvMIGUUIDPrefix + "<CI access minor>"}, Found: env}
}

// UUIDEnv returns the minor→UUID pairs named by NVINJECT_GPU_UUID_<minor>,
// the one reading of that environment: a CDI device's edits and the
// container's own (untrusted) env alike. A variable whose minor is not
// written as nvinject writes it (decimal, no sign or leading zero) is kept
// under minor -1, so that it still counts as a disagreement: "_03" must not
// stand in for "_3", as which of the two won would depend on the order.
func UUIDEnv(env []string) map[int64]string { return minorEnv(env, EnvUUIDPrefix) }

// MIGUUIDEnv is UUIDEnv for NVINJECT_MIG_UUID_<CI access minor>.
func MIGUUIDEnv(env []string) map[int64]string { return minorEnv(env, EnvMIGUUIDPrefix) }

func minorEnv(env []string, prefix string) map[int64]string {
	out := map[int64]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		s, ok := strings.CutPrefix(k, prefix)
		if !ok {
			continue
		}
		m, err := strconv.ParseInt(s, 10, 64)
		if err != nil || m < 0 || strconv.FormatInt(m, 10) != s {
			m = -1
		}
		out[m] = v
	}
	return out
}

// Input is everything one check needs.
type Input struct {
	// Allocated are the units the container's CDI devices stand for.
	Allocated []GPU
	// Nodes and Env are the container's as they will be after adjustment.
	Nodes []Node
	Env   []string
	// Inventory is the node as discovered at start; nil if unknown.
	Inventory *Inventory
	// Kubelet lists the UUIDs kubelet assigned; nil when not consulted.
	Kubelet []string
}

// Inventory is the node's GPUs and MIG devices as discovered at start.
type Inventory struct {
	// GPUs maps each GPU's UUID to its minor; MIGParents holds those with
	// MIG mode on, which are never handed out whole.
	GPUs       map[string]int64
	MIGParents map[string]bool
	// MIG maps each MIG device's UUID to where it is.
	MIG map[string]Slice
	// CapsMajor is /dev/nvidia-caps' major (0 with MIG off everywhere);
	// ConfigMinor and MonitorMinor its config and monitor nodes'.
	CapsMajor, ConfigMinor, MonitorMinor int64
}

// Slice is one MIG device as discovered: its parent, its GI and CI IDs
// and the minors of its parent's node and its access nodes. Index is its
// position on the parent, kubelet's "<GPU index>:<Index>" device ID under
// DEVICE_ID_STRATEGY=index.
type Slice struct {
	UUID, ParentUUID, Profile  string
	GPUIndex, Index, GI, CI    int
	Parent, GIAccess, CIAccess int64
}

func (s Slice) String() string {
	return fmt.Sprintf("MIG %s %s (GPU %d GI %d CI %d)", s.Profile, s.UUID, s.GPUIndex, s.GI, s.CI)
}

// InventoryOf reads the inventory from a discovered node.
func InventoryOf(n gpu.Node) *Inventory {
	inv := &Inventory{GPUs: make(map[string]int64, len(n.Devices)), MIGParents: map[string]bool{}, MIG: map[string]Slice{},
		CapsMajor: n.MIGConfig.Major, ConfigMinor: n.MIGConfig.Minor, MonitorMinor: n.MIGMonitor.Minor}
	for _, d := range n.Devices {
		inv.GPUs[d.UUID] = int64(d.Minor)
		if d.MIGEnabled {
			inv.MIGParents[d.UUID] = true
		}
		for i, m := range d.MIG {
			inv.MIG[m.UUID] = Slice{UUID: m.UUID, ParentUUID: d.UUID, Profile: m.Profile, GPUIndex: d.Index, Index: i, GI: m.GPUInstance, CI: m.ComputeInstance,
				Parent: int64(d.Minor), GIAccess: m.GIAccess.Minor, CIAccess: m.CIAccess.Minor}
			inv.CapsMajor = cmp.Or(inv.CapsMajor, m.CIAccess.Major)
		}
	}
	return inv
}

// Name names an allocated unit in messages: a GPU by its UUID, a MIG
// device as "MIG 1g.10gb MIG-… (GPU 1 GI 3 CI 0)", from the inventory when
// it knows the device, else from its CDI annotations.
func (inv *Inventory) Name(g GPU) string {
	if !g.IsMIG() {
		return g.UUID
	}
	if inv != nil {
		if s, ok := inv.MIG[g.UUID]; ok {
			return s.String()
		}
	}
	s := "MIG " + cmp.Or(g.MIG.Profile, "device") + " " + g.UUID
	if g.MIG.GPUIndex != "" {
		s += " (GPU " + g.MIG.GPUIndex + ")"
	}
	return s
}

// The driver's fixed minors of the MIG config and monitor nodes, for a
// check without an inventory.
const (
	configMinor  = 1
	monitorMinor = 2
)

// capsName says what the caps node of minor m is, for a refusal.
func (inv *Inventory) capsName(m int64) string {
	config, monitor := int64(configMinor), int64(monitorMinor)
	if inv != nil && inv.ConfigMinor != 0 {
		config, monitor = inv.ConfigMinor, inv.MonitorMinor
	}
	switch m {
	case config:
		return "the MIG config node (creates and destroys GPU instances)"
	case monitor:
		return "the MIG monitor node (observes every GPU instance)"
	}
	if inv != nil {
		for _, u := range slices.Sorted(maps.Keys(inv.MIG)) {
			switch s := inv.MIG[u]; m {
			case s.CIAccess:
				return "the CI access node of " + s.String()
			case s.GIAccess:
				return "the GI access node of " + s.String()
			}
		}
	}
	return "a MIG capability node"
}

// check compares an allocated unit with the inventory.
func (inv *Inventory) check(g GPU) error {
	if inv == nil {
		return nil
	}
	if !g.IsMIG() {
		if inv.MIGParents[g.UUID] {
			return &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("CDI spec gives %s whole but MIG mode is on for it on this node; regenerate the CDI spec", g.UUID),
				Expected: []string{"its MIG devices"}, Found: []string{pair(EnvUUIDPrefix, g.Minor, g.UUID)}}
		}
		if m, ok := inv.GPUs[g.UUID]; !ok || m != g.Minor {
			return &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("CDI spec places %s at /dev/nvidia%d but this node's inventory disagrees; regenerate the CDI spec", g.UUID, g.Minor),
				Expected: []string{pair(EnvUUIDPrefix, m, g.UUID)}, Found: []string{pair(EnvUUIDPrefix, g.Minor, g.UUID)}}
		}
		return nil
	}
	s, ok := inv.MIG[g.UUID]
	if !ok || s.Parent != g.Minor || s.GIAccess != g.MIG.GI.Minor || s.CIAccess != g.MIG.CI.Minor {
		expected := []string{"no MIG device " + g.UUID}
		if ok {
			expected = []string{place(s.Parent, s.GIAccess, s.CIAccess)}
		}
		return &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("CDI spec places %s but this node's inventory disagrees; regenerate the CDI spec", inv.Name(g)),
			Expected: expected, Found: []string{place(g.Minor, g.MIG.GI.Minor, g.MIG.CI.Minor)}}
	}
	return nil
}

func place(parent, gi, ci int64) string {
	return fmt.Sprintf("/dev/nvidia%d+%s+%s", parent, capsPath(gi), capsPath(ci))
}

// Check returns nil when the container gets exactly the allocated units:
// the nodes of its whole GPUs, and its MIG devices' parents' and access
// nodes, no other GPU or caps node, and the UUID environment naming them.
func Check(in Input) error {
	whole := map[int64]string{}  // minor → UUID
	parents := map[int64]GPU{}   // parent's minor → its first MIG device
	slicesOf := map[int64]GPU{}  // GI or CI access minor → MIG device
	migEnv := map[int64]string{} // CI access minor → MIG UUID
	nodes := map[int64]bool{}    // the GPU nodes allowed: whole GPUs' and parents'
	majors := map[int64]bool{}
	if in.Inventory != nil && in.Inventory.CapsMajor != 0 {
		majors[in.Inventory.CapsMajor] = true
	}
	for _, g := range in.Allocated {
		if err := in.Inventory.check(g); err != nil {
			return err
		}
		nodes[g.Minor] = true
		if !g.IsMIG() {
			whole[g.Minor] = g.UUID
			continue
		}
		if _, ok := parents[g.Minor]; !ok {
			parents[g.Minor] = g
		}
		if _, ok := slicesOf[g.MIG.GI.Minor]; !ok {
			slicesOf[g.MIG.GI.Minor] = g
		}
		slicesOf[g.MIG.CI.Minor] = g
		migEnv[g.MIG.CI.Minor] = g.UUID
		majors[g.MIG.GI.Major], majors[g.MIG.CI.Major] = true, true
	}
	for _, m := range slices.Sorted(maps.Keys(parents)) {
		if u, ok := whole[m]; ok {
			return &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("the container's CDI devices give %s whole and its %s; a MIG GPU is never handed out whole: regenerate the CDI spec", u, in.Inventory.Name(parents[m])),
				Expected: []string{in.Inventory.Name(parents[m])}, Found: []string{u, parents[m].UUID}}
		}
	}

	found := map[int64]bool{}
	caps := map[int64]Node{}
	for _, n := range in.Nodes {
		switch {
		case n.IsGPU():
			found[n.Minor] = true
		case n.caps(majors):
			if _, ok := caps[n.Minor]; !ok {
				caps[n.Minor] = n
			}
		}
	}
	for _, m := range slices.Sorted(maps.Keys(found)) {
		if !nodes[m] {
			return &MismatchError{Reason: ReasonForeignGPU, What: fmt.Sprintf("container would get /dev/nvidia%d which was not allocated to it", m),
				Expected: minors(nodes), Found: minors(found)}
		}
	}
	for _, m := range slices.Sorted(maps.Keys(caps)) {
		if _, ok := slicesOf[m]; !ok {
			return &MismatchError{Reason: ReasonForeignSlice, What: fmt.Sprintf("container would get %s (minor %d), %s, which was not allocated to it", caps[m].Path, m, in.Inventory.capsName(m)),
				Expected: capsPaths(slicesOf), Found: capsPaths(caps)}
		}
	}
	for _, m := range slices.Sorted(maps.Keys(whole)) {
		if !found[m] {
			return &MismatchError{Reason: ReasonMissingGPU, What: fmt.Sprintf("container would lack /dev/nvidia%d of allocated %s", m, whole[m]),
				Expected: minors(nodes), Found: minors(found)}
		}
	}
	for _, g := range in.Allocated {
		if !g.IsMIG() {
			continue
		}
		_, gi := caps[g.MIG.GI.Minor]
		_, ci := caps[g.MIG.CI.Minor]
		var lacks string
		switch {
		case !found[g.Minor]:
			lacks = fmt.Sprintf("/dev/nvidia%d, the parent", g.Minor)
		case !gi:
			lacks = capsPath(g.MIG.GI.Minor) + ", the GI access node,"
		case !ci:
			lacks = capsPath(g.MIG.CI.Minor) + ", the CI access node,"
		default:
			continue
		}
		return &MismatchError{Reason: ReasonMissingSlice, What: fmt.Sprintf("container would lack %s of allocated %s", lacks, in.Inventory.Name(g)),
			Expected: slices.Concat(minors(parents), capsPaths(slicesOf)), Found: slices.Concat(minors(found), capsPaths(caps))}
	}

	if env := UUIDEnv(in.Env); !maps.Equal(env, whole) {
		what := "the " + EnvUUIDPrefix + "* environment does not name the allocated GPUs"
		for _, m := range slices.Sorted(maps.Keys(env)) {
			if g, ok := parents[m]; ok {
				what += fmt.Sprintf(" (/dev/nvidia%d is the parent of allocated %s and no whole GPU)", m, in.Inventory.Name(g))
				break
			}
		}
		return &MismatchError{Reason: ReasonEnv, What: what, Expected: pairs(EnvUUIDPrefix, whole), Found: pairs(EnvUUIDPrefix, env)}
	}
	if env := MIGUUIDEnv(in.Env); !maps.Equal(env, migEnv) {
		return &MismatchError{Reason: ReasonEnv, What: "the " + EnvMIGUUIDPrefix + "* environment does not name the allocated MIG devices",
			Expected: pairs(EnvMIGUUIDPrefix, migEnv), Found: pairs(EnvMIGUUIDPrefix, env)}
	}

	if in.Kubelet != nil {
		got := slices.Sorted(slices.Values(in.Kubelet))
		if want := UUIDs(in.Allocated); !slices.Equal(got, want) {
			return &MismatchError{Reason: ReasonKubelet, What: "kubelet's PodResources assigned other GPUs to this container",
				Expected: got, Found: want}
		}
	}
	return nil
}

// UUIDs lists the allocated UUIDs (GPUs' and MIG devices') sorted.
func UUIDs(gpus []GPU) []string {
	return slices.Sorted(slices.Values(uuidsOf(gpus)))
}

func uuidsOf(gpus []GPU) []string {
	out := make([]string, 0, len(gpus))
	for _, g := range gpus {
		out = append(out, g.UUID)
	}
	return out
}

func minors[V any](m map[int64]V) []string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, "/dev/nvidia"+strconv.FormatInt(k, 10))
	}
	return out
}

func capsPath(m int64) string { return contract.CapsDir + "/nvidia-cap" + strconv.FormatInt(m, 10) }

func capsPaths[V any](m map[int64]V) []string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, capsPath(k))
	}
	return out
}

func paths(nodes []Node) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Path)
	}
	return out
}

func pairs(prefix string, m map[int64]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, pair(prefix, k, m[k]))
	}
	return out
}

func pair(prefix string, minor int64, uuid string) string {
	return fmt.Sprintf("%s%d=%s", prefix, minor, uuid)
}
