package gpuselect

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// Unit is one device a resource hands out: a whole GPU, or one MIG device
// of its parent GPU.
type Unit struct {
	// GPU is the whole GPU, or the MIG device's parent.
	GPU gpu.Device
	// MIG is the MIG device; nil for a whole GPU.
	MIG *gpu.MIGDevice
}

// UUID is the unit's own UUID: the GPU's, or the MIG device's.
func (u Unit) UUID() string {
	if u.MIG != nil {
		return u.MIG.UUID
	}
	return u.GPU.UUID
}

// String names the unit for logs and errors.
func (u Unit) String() string {
	if u.MIG != nil {
		return fmt.Sprintf("MIG %s %s (GPU %d, GI %d CI %d)", u.MIG.Profile, u.MIG.UUID, u.GPU.Index, u.MIG.GPUInstance, u.MIG.ComputeInstance)
	}
	return fmt.Sprintf("GPU %d %s", u.GPU.Index, u.GPU.UUID)
}

// Resource is one extended resource and the units it publishes, in GPU
// index then MIG device order.
type Resource struct {
	Name  string
	Units []Unit
	// Profile is the MIG profile every unit has; empty for whole GPUs.
	Profile string
}

// Resources groups the selected GPUs (Select's result under mig) into the
// resources they are published as, gpuResource (nvidia.com/gpu) first:
// under none and for MIG-off GPUs under mixed, whole GPUs; under single,
// every MIG device as gpuResource; under mixed each MIG profile as
// contract.MIGResourceName. A MIG GPU without MIG devices publishes none.
// Single refuses a node that mixes MIG on and off, or MIG profiles, as
// NVIDIA's device plugin does, naming the GPUs to change.
func Resources(devs []gpu.Device, mig MIGStrategy, gpuResource string) ([]Resource, error) {
	var whole []Unit
	byProfile := map[string][]Unit{}
	var on, off []string
	for _, d := range devs {
		if !d.MIGEnabled || mig == MIGNone {
			whole = append(whole, Unit{GPU: d})
			off = append(off, fmt.Sprintf("%d", d.Index))
			continue
		}
		on = append(on, fmt.Sprintf("%d", d.Index))
		for i := range d.MIG {
			m := d.MIG[i]
			byProfile[m.Profile] = append(byProfile[m.Profile], Unit{GPU: d, MIG: &m})
		}
	}
	profiles := slices.Sorted(func(yield func(string) bool) {
		for p := range byProfile {
			if !yield(p) {
				return
			}
		}
	})
	switch mig {
	case MIGNone:
		return []Resource{{Name: gpuResource, Units: whole}}, nil
	case MIGSingle:
		if len(on) == 0 {
			return []Resource{{Name: gpuResource, Units: whole}}, nil
		}
		if len(off) > 0 {
			return nil, fmt.Errorf("MIG_STRATEGY=single needs MIG mode on every selected GPU, but GPU(s) %s have it on and %s off; turn MIG on for all (nvidia-smi -i N -mig 1), select only the MIG GPUs, or use MIG_STRATEGY=mixed", strings.Join(on, ","), strings.Join(off, ","))
		}
		if len(profiles) > 1 {
			return nil, fmt.Errorf("MIG_STRATEGY=single needs one MIG profile on the node, but it has %s; lay every GPU out in one profile (nvidia-smi mig -cgi, mig-parted) or use MIG_STRATEGY=mixed", strings.Join(profiles, ", "))
		}
		var units []Unit
		profile := ""
		for _, p := range profiles {
			units, profile = byProfile[p], p
		}
		return []Resource{{Name: gpuResource, Units: sortUnits(units), Profile: profile}}, nil
	case MIGMixed:
		out := []Resource{{Name: gpuResource, Units: whole}}
		for _, p := range profiles {
			out = append(out, Resource{Name: contract.MIGResourceName(gpuResource, p), Units: sortUnits(byProfile[p]), Profile: p})
		}
		return out, nil
	}
	return nil, fmt.Errorf("MIG strategy %q is not one of none, single, mixed", mig)
}

func sortUnits(us []Unit) []Unit {
	slices.SortStableFunc(us, func(a, b Unit) int {
		return cmp.Or(cmp.Compare(a.GPU.Index, b.GPU.Index), cmp.Compare(a.MIG.GPUInstance, b.MIG.GPUInstance), cmp.Compare(a.MIG.ComputeInstance, b.MIG.ComputeInstance))
	})
	return us
}
