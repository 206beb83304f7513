// Package verify checks that the GPUs a container will get are exactly the
// ones allocated to it: by device node (major 195, minor N), by the
// UUID-naming environment, and optionally by kubelet's own record.
package verify

import (
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

// Reason classifies a mismatch for metrics and logs.
type Reason string

// Mismatch reasons.
const (
	ReasonUnknownUUID Reason = "unknown-uuid"
	ReasonStaleSpec   Reason = "stale-spec"
	ReasonMissingGPU  Reason = "missing-gpu"
	ReasonForeignGPU  Reason = "foreign-gpu"
	ReasonEnv         Reason = "env-mismatch"
	ReasonKubelet     Reason = "podresources-mismatch"
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

// GPU is one allocated GPU: its UUID and the minor of its /dev/nvidiaN.
type GPU struct {
	UUID  string
	Minor int64
}

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

// FromEdits derives the GPUs a CDI device stands for from its own edits:
// each GPU node (195:N) must be named by NVINJECT_GPU_UUID_N. name is the
// device's qualified name; when it names a UUID, that UUID must match.
func FromEdits(name string, nodes []Node, env []string) ([]GPU, error) {
	uuids := UUIDEnv(env)
	var out []GPU
	for _, n := range nodes {
		if !n.IsGPU() {
			continue
		}
		u, ok := uuids[n.Minor]
		if !ok {
			return nil, &MismatchError{Reason: ReasonUnknownUUID, What: fmt.Sprintf("CDI device %s gives %s (195:%d) but no %s%d naming its UUID; regenerate the spec with nvinject", name, n.Path, n.Minor, EnvUUIDPrefix, n.Minor),
				Expected: []string{EnvUUIDPrefix + strconv.FormatInt(n.Minor, 10)}, Found: env}
		}
		out = append(out, GPU{UUID: u, Minor: n.Minor})
	}
	if _, dev, ok := strings.Cut(name, "="); ok && strings.HasPrefix(dev, "GPU-") {
		if len(out) != 1 || out[0].UUID != dev {
			return nil, &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("CDI device %s does not describe the GPU it is named after; regenerate the spec", name),
				Expected: []string{dev}, Found: uuidsOf(out)}
		}
	}
	return out, nil
}

// UUIDEnv returns the minor→UUID pairs named by NVINJECT_GPU_UUID_<minor>,
// the one reading of that environment: a CDI device's edits and the
// container's own (untrusted) env alike. A variable whose minor is not
// written as nvinject writes it (decimal, no sign or leading zero) is kept
// under minor -1, so that it still counts as a disagreement: "_03" must not
// stand in for "_3", as which of the two won would depend on the order.
func UUIDEnv(env []string) map[int64]string {
	out := map[int64]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		s, ok := strings.CutPrefix(k, EnvUUIDPrefix)
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
	// Allocated are the GPUs the container's CDI devices stand for.
	Allocated []GPU
	// Nodes and Env are the container's as they will be after adjustment.
	Nodes []Node
	Env   []string
	// Inventory maps UUID→minor as discovered at start; nil if unknown.
	Inventory map[string]int64
	// Kubelet lists the UUIDs kubelet assigned; nil when not consulted.
	Kubelet []string
}

// Check returns nil when the container gets exactly the allocated GPUs.
func Check(in Input) error {
	want := map[int64]string{}
	for _, g := range in.Allocated {
		if m, ok := in.Inventory[g.UUID]; in.Inventory != nil && (!ok || m != g.Minor) {
			return &MismatchError{Reason: ReasonStaleSpec, What: fmt.Sprintf("CDI spec places %s at /dev/nvidia%d but this node's inventory disagrees; regenerate the CDI spec", g.UUID, g.Minor),
				Expected: []string{pair(m, g.UUID)}, Found: []string{pair(g.Minor, g.UUID)}}
		}
		want[g.Minor] = g.UUID
	}
	wantUUIDs := slices.Sorted(maps.Values(want))

	found := map[int64]bool{}
	for _, n := range in.Nodes {
		if n.IsGPU() {
			found[n.Minor] = true
		}
	}
	for m := range found {
		if _, ok := want[m]; !ok {
			return &MismatchError{Reason: ReasonForeignGPU, What: fmt.Sprintf("container would get /dev/nvidia%d which was not allocated to it", m),
				Expected: minors(want), Found: minors(found)}
		}
	}
	for m := range want {
		if !found[m] {
			return &MismatchError{Reason: ReasonMissingGPU, What: fmt.Sprintf("container would lack /dev/nvidia%d of allocated %s", m, want[m]),
				Expected: minors(want), Found: minors(found)}
		}
	}

	if env := UUIDEnv(in.Env); !maps.Equal(env, want) {
		return &MismatchError{Reason: ReasonEnv, What: "the " + EnvUUIDPrefix + "* environment does not name the allocated GPUs",
			Expected: pairs(want), Found: pairs(env)}
	}

	if in.Kubelet != nil {
		got := slices.Sorted(slices.Values(in.Kubelet))
		if !slices.Equal(got, wantUUIDs) {
			return &MismatchError{Reason: ReasonKubelet, What: "kubelet's PodResources assigned other GPUs to this container",
				Expected: got, Found: wantUUIDs}
		}
	}
	return nil
}

// UUIDs lists the allocated UUIDs sorted.
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

func pairs(m map[int64]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, pair(k, m[k]))
	}
	return out
}

func pair(minor int64, uuid string) string {
	return fmt.Sprintf("%s%d=%s", EnvUUIDPrefix, minor, uuid)
}
