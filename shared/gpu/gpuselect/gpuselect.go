// Package gpuselect applies NVIDIA_VISIBLE_DEVICES semantics (NVIDIA's
// ConfigMap key selected-gpu-uuid) and the MIG strategy to a node's GPUs.
package gpuselect

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// Selector is a parsed NVIDIA_VISIBLE_DEVICES value.
type Selector struct {
	All     bool
	None    bool
	UUIDs   []string
	Indices []int
}

// ErrEmpty is returned for an empty selection value.
var ErrEmpty = errors.New("no GPU selection given")

// Parse reads "all", "none", "void", or a comma list of GPU UUIDs and
// indices ("GPU-8f3c...,1").
func Parse(v string) (Selector, error) {
	v = strings.TrimSpace(v)
	switch strings.ToLower(v) {
	case "":
		return Selector{}, fmt.Errorf("%w: set NVIDIA_VISIBLE_DEVICES (ConfigMap key selected-gpu-uuid) to GPU UUIDs, indices, all or none", ErrEmpty)
	case "all":
		return Selector{All: true}, nil
	case "none", "void":
		return Selector{None: true}, nil
	}
	var s Selector
	seen := map[string]bool{}
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return Selector{}, fmt.Errorf("GPU selection %q has an empty entry; give a comma list without blanks", v)
		}
		key := strings.ToLower(f)
		if seen[key] {
			return Selector{}, fmt.Errorf("GPU selection %q names %q twice; list each GPU once", v, f)
		}
		seen[key] = true
		if i, err := strconv.Atoi(f); err == nil {
			if i < 0 {
				return Selector{}, fmt.Errorf("GPU selection %q: index %d is negative; indices start at 0", v, i)
			}
			s.Indices = append(s.Indices, i)
			continue
		}
		if !strings.HasPrefix(f, "GPU-") && !strings.HasPrefix(f, "MIG-") {
			return Selector{}, fmt.Errorf("GPU selection %q: %q is neither an index nor a GPU UUID (GPU-...); list UUIDs with nvidia-smi -L", v, f)
		}
		if strings.HasPrefix(f, "MIG-") {
			return Selector{}, fmt.Errorf("GPU selection %q: %q is a MIG device; select its parent GPU's UUID (nvidia-smi -L lists it above its MIG devices), and MIG_STRATEGY=single or mixed publishes the parent's MIG devices", v, f)
		}
		s.UUIDs = append(s.UUIDs, f)
	}
	return s, nil
}

// MIGStrategy says how MIG-enabled GPUs are treated, with NVIDIA's device
// plugin's meanings.
type MIGStrategy string

// MIG strategies.
const (
	// MIGNone publishes whole GPUs and skips any GPU with MIG mode on.
	MIGNone MIGStrategy = "none"
	// MIGSingle publishes the MIG devices of MIG GPUs under the whole GPUs'
	// resource: every selected GPU has MIG mode on and every MIG device one
	// profile; with MIG off on all of them it is MIGNone.
	MIGSingle MIGStrategy = "single"
	// MIGMixed publishes whole GPUs under their resource and each MIG
	// profile under a resource of its own (nvidia.com/mig-1g.10gb).
	MIGMixed MIGStrategy = "mixed"
)

// ParseMIGStrategy reads a --mig-strategy (MIG_STRATEGY) value.
func ParseMIGStrategy(v string) (MIGStrategy, error) {
	switch MIGStrategy(v) {
	case "":
		return MIGNone, nil
	case MIGNone, MIGSingle, MIGMixed:
		return MIGStrategy(v), nil
	}
	return "", fmt.Errorf("MIG_STRATEGY=%s is not valid; use none (whole GPUs), single (MIG devices of one profile as the GPU resource) or mixed (a resource per MIG profile)", contract.Quote(v))
}

// Skipped is a GPU that the selection matched but that is not published.
type Skipped struct {
	Device gpu.Device
	Reason string
}

// Select returns the devices to publish, in index order, and those it left
// out with the reason. Naming a GPU that is absent or unusable is an error.
// Under single and mixed a MIG GPU is selected with its MIG devices (it
// publishes them, never itself); one whose MIG devices could not be read
// (MIGErr) is left out, or an error when named.
func Select(devs []gpu.Device, s Selector, mig MIGStrategy) ([]gpu.Device, []Skipped, error) {
	if s.None {
		return nil, nil, nil
	}
	want := make([]bool, len(devs))
	switch {
	case s.All:
		for i := range want {
			want[i] = true
		}
	default:
		for _, u := range s.UUIDs {
			i := indexOfUUID(devs, u)
			if i < 0 {
				return nil, nil, fmt.Errorf("selected GPU %s is not on this node; GPUs present: %s; fix the ConfigMap key selected-gpu-uuid", u, presentList(devs))
			}
			if want[i] {
				return nil, nil, fmt.Errorf("GPU %s is selected twice (by UUID and index %d); list each GPU once", u, devs[i].Index)
			}
			want[i] = true
		}
		for _, x := range s.Indices {
			i := indexOfIndex(devs, x)
			if i < 0 {
				return nil, nil, fmt.Errorf("selected GPU index %d is not on this node; GPUs present: %s", x, presentList(devs))
			}
			if want[i] {
				return nil, nil, fmt.Errorf("GPU index %d (%s) is selected twice; list each GPU once", x, devs[i].UUID)
			}
			want[i] = true
		}
	}
	var out []gpu.Device
	var skipped []Skipped
	for i, d := range devs {
		if !want[i] {
			continue
		}
		if d.MIGEnabled && mig != MIGNone && d.MIGErr != nil {
			reason := fmt.Sprintf("GPU %d (%s) has MIG mode on but its MIG devices cannot be read: %v; check the driver's /proc/driver/nvidia/capabilities and nvidia-smi mig -lgi", d.Index, d.UUID, d.MIGErr)
			if !s.All {
				return nil, nil, errors.New(reason)
			}
			skipped = append(skipped, Skipped{Device: d, Reason: reason})
			continue
		}
		if d.MIGEnabled && mig == MIGNone {
			reason := fmt.Sprintf("GPU %d (%s) has MIG mode on and MIG_STRATEGY=none publishes whole GPUs only; set MIG_STRATEGY=single or mixed to publish its MIG devices, or disable MIG with `nvidia-smi -i %d -mig 0` (and reset the GPU) to publish it whole", d.Index, d.UUID, d.Index)
			if !s.All {
				return nil, nil, errors.New(reason)
			}
			skipped = append(skipped, Skipped{Device: d, Reason: reason})
			continue
		}
		out = append(out, d)
	}
	return out, skipped, nil
}

func indexOfUUID(devs []gpu.Device, u string) int {
	for i, d := range devs {
		if strings.EqualFold(d.UUID, u) {
			return i
		}
	}
	return -1
}

func indexOfIndex(devs []gpu.Device, x int) int {
	for i, d := range devs {
		if d.Index == x {
			return i
		}
	}
	return -1
}

func presentList(devs []gpu.Device) string {
	if len(devs) == 0 {
		return "none"
	}
	parts := make([]string, len(devs))
	for i, d := range devs {
		parts[i] = fmt.Sprintf("%d=%s", d.Index, d.UUID)
	}
	return strings.Join(parts, ", ")
}
