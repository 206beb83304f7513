// Package nodelabels is the GPU node's labels in NVIDIA GPU feature
// discovery's (GFD) names, computed from the GPUs a kubelet plugin
// publishes (Compute), and their publication on the plugin's own Node by
// server-side apply under one field manager both plugins share (Publisher).
package nodelabels

import (
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/sharing"
)

// Facts are what the labels say: the node's driver and every GPU NVML
// sees (mig.capable, as GFD), the GPUs the plugin publishes and how.
type Facts struct {
	Node      gpu.Node
	Published []gpu.Device
	MIG       gpuselect.MIGStrategy
	// ResourceName is what whole GPUs are published as (--resource-name);
	// the sharing configuration names resources by it.
	ResourceName string
	Sharing      sharing.Config
	// MPS is whether the node's GPUs can be shared through MPS now: the
	// device plugin shares a resource through MPS, or nvinject-dra's
	// driver root has the MPS control program for MPS claims.
	MPS bool
}

// Result is the computed label set and what the caller should report.
type Result struct {
	Labels map[string]string
	// Models are the published GPUs' distinct names when there are more
	// than one: the labels describe the first (GFD describes one model too).
	Models []string
	// Invalid are labels left out because their value is not a valid label
	// value ("key=value: why").
	Invalid []string
}

// Compute returns the labels for f. No published GPU gives no labels, so
// applying the result removes those published before.
func Compute(f Facts) Result {
	r := Result{Labels: map[string]string{}}
	if len(f.Published) == 0 {
		return r
	}
	l := r.Labels
	driverLabels(l, f.Node)
	capable := false
	for _, d := range f.Node.Devices {
		capable = capable || d.MIGCapable
	}
	l[contract.GFDLabelMIGCapable] = strconv.FormatBool(capable)
	l[contract.GFDLabelMPSCapable] = strconv.FormatBool(f.MPS)
	if f.MIG != gpuselect.MIGNone {
		l[contract.GFDLabelMIGStrategy] = string(f.MIG)
	}

	model, models := pickModel(f.Published)
	if len(models) > 1 {
		r.Models = models
	}
	count := 0
	for _, d := range f.Published {
		if d.Name == model.Name {
			count++
		}
	}
	// A MIG GPU's whole-GPU labels are unshared, as GFD writes them.
	replicas, strategy := 0, "none"
	if !model.MIGEnabled || f.MIG == gpuselect.MIGNone {
		replicas, strategy = shared(f.Sharing, f.ResourceName)
	}
	res := resource{prefix: contract.GFDGPUResource, l: l}
	res.set(contract.GFDSuffixProduct, product(f.Sharing, f.ResourceName, model.Name))
	res.set(contract.GFDSuffixCount, strconv.Itoa(count))
	res.set(contract.GFDSuffixReplicas, strconv.Itoa(replicas))
	res.set(contract.GFDSuffixSharingStrategy, strategy)
	if mib := model.MemoryBytes >> 20; mib > 0 {
		res.set(contract.GFDSuffixMemory, strconv.FormatUint(mib, 10))
	}
	computeLabels(l, model.ComputeCapability)

	if f.MIG != gpuselect.MIGNone {
		// Resources only fails on layouts the node refused to publish.
		rs, _ := gpuselect.Resources(f.Published, f.MIG, f.ResourceName)
		for _, rr := range rs {
			if rr.Profile != "" && len(rr.Units) > 0 {
				migLabels(l, f, rr)
			}
		}
	}
	for k, v := range l {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			r.Invalid = append(r.Invalid, k+"="+v+": "+strings.Join(errs, "; "))
			delete(l, k)
		}
	}
	slices.Sort(r.Invalid)
	return r
}

// resource writes GFD's <resource>.<suffix> labels.
type resource struct {
	prefix string
	l      map[string]string
}

func (r resource) set(suffix, v string) { r.l[r.prefix+"."+suffix] = v }

// pickModel is the GPU the whole-GPU labels describe: the first published
// one with MIG off (GFD's whole GPUs override its MIG GPUs), else the
// first; and every distinct model published.
func pickModel(published []gpu.Device) (gpu.Device, []string) {
	model := published[0]
	for _, d := range published {
		if !d.MIGEnabled {
			model = d
			break
		}
	}
	var models []string
	for _, d := range published {
		if !slices.Contains(models, d.Name) {
			models = append(models, d.Name)
		}
	}
	return model, models
}

// migLabels describes one MIG resource: under single the GPU resource's
// labels (overriding the whole GPU's), under mixed nvidia.com/mig-<profile>.
func migLabels(l map[string]string, f Facts, rr gpuselect.Resource) {
	prefix := contract.GFDGPUResource
	if f.MIG == gpuselect.MIGMixed {
		prefix = contract.GFDMIGResource(rr.Profile)
	}
	u := rr.Units[0]
	res := resource{prefix: prefix, l: l}
	replicas, strategy := shared(f.Sharing, rr.Name)
	res.set(contract.GFDSuffixProduct, product(f.Sharing, rr.Name, u.GPU.Name, "MIG", strings.ReplaceAll(rr.Profile, "+", ".")))
	res.set(contract.GFDSuffixCount, strconv.Itoa(len(rr.Units)))
	res.set(contract.GFDSuffixReplicas, strconv.Itoa(replicas))
	res.set(contract.GFDSuffixSharingStrategy, strategy)
	res.set(contract.GFDSuffixMemory, strconv.FormatUint(u.MIG.MemoryBytes>>20, 10))
	res.set(contract.GFDSuffixMultiprocessors, strconv.Itoa(u.MIG.Multiprocessors))
	res.set(contract.GFDSuffixSlicesGI, strconv.Itoa(u.MIG.GPUSlices))
	res.set(contract.GFDSuffixSlicesCI, strconv.Itoa(u.MIG.ComputeSlices))
}

// shared is a resource's replicas and GFD's sharing strategy name.
func shared(c sharing.Config, resource string) (int, string) {
	rep, ok := c.For(resource)
	if !ok || rep.Replicas < 2 {
		return 1, "none"
	}
	return rep.Replicas, string(rep.Strategy)
}

// product is GFD's product value: the parts sanitised and joined by '-',
// with -SHARED when the resource is shared under its own name (a renamed
// shared resource is told apart by its name).
func product(c sharing.Config, resource string, parts ...string) string {
	var out []string
	for _, p := range parts {
		if p = sanitise(p); p != "" {
			out = append(out, p)
		}
	}
	if rep, ok := c.For(resource); ok && rep.Replicas > 1 && rep.Name == resource {
		out = append(out, "SHARED")
	}
	return strings.Join(out, "-")
}

var notLabelChar = regexp.MustCompile(`[^A-Za-z0-9-_. ]`)

// sanitise keeps what a label value may hold and writes blanks as '-':
// "NVIDIA H100 80GB HBM3" gives "NVIDIA-H100-80GB-HBM3".
func sanitise(s string) string {
	return strings.Join(strings.Fields(notLabelChar.ReplaceAllString(s, "")), "-")
}

// driverLabels are the driver's and CUDA's versions: 535.261.03, 12.2.
func driverLabels(l map[string]string, n gpu.Node) {
	if n.DriverVersion != "" {
		l[contract.GFDLabelDriverVersion] = n.DriverVersion
		parts := strings.Split(n.DriverVersion, ".")
		keys := []string{contract.GFDLabelDriverMajor, contract.GFDLabelDriverMinor, contract.GFDLabelDriverRevision}
		for i := 0; i < len(parts) && i < len(keys); i++ {
			l[keys[i]] = parts[i]
		}
	}
	if major, minor, ok := strings.Cut(n.CUDAVersion, "."); ok {
		l[contract.GFDLabelCUDAVersion] = n.CUDAVersion
		l[contract.GFDLabelCUDAMajor] = major
		l[contract.GFDLabelCUDAMinor] = minor
	}
}

// computeLabels are the compute capability ("8.0") and GFD's family for it.
func computeLabels(l map[string]string, cc string) {
	ma, mi, ok := strings.Cut(cc, ".")
	major, err1 := strconv.Atoi(ma)
	minor, err2 := strconv.Atoi(mi)
	if !ok || err1 != nil || err2 != nil || major == 0 {
		return
	}
	l[contract.GFDLabelComputeMajor] = ma
	l[contract.GFDLabelComputeMinor] = mi
	l[contract.GFDLabelFamily] = family(major, minor)
}

// family is GFD's architecture family of a compute capability.
func family(major, minor int) string {
	switch major {
	case 1:
		return "tesla"
	case 2:
		return "fermi"
	case 3:
		return "kepler"
	case 5:
		return "maxwell"
	case 6:
		return "pascal"
	case 7:
		if minor < 5 {
			return "volta"
		}
		return "turing"
	case 8:
		if minor < 9 {
			return "ampere"
		}
		return "ada-lovelace"
	case 9:
		return "hopper"
	case 10, 12:
		return "blackwell"
	case 13:
		return "rubin"
	}
	return "undefined"
}
