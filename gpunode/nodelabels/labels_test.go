package nodelabels

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/sharing"
)

// simFacts discovers the simulated node nvml and selects its GPUs the way
// the node does (every GPU, the MIG strategy).
func simFacts(t *testing.T, nvml string, mig gpuselect.MIGStrategy) Facts {
	t.Helper()
	b, err := backend.Open(nvml, backend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n, err := b.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all, err := gpuselect.Parse("all")
	if err != nil {
		t.Fatal(err)
	}
	published, _, err := gpuselect.Select(n.Devices, all, mig)
	if err != nil {
		t.Fatal(err)
	}
	return Facts{Node: n, Published: published, MIG: mig, ResourceName: contract.ResourceName}
}

func sharingConfig(t *testing.T, doc string) sharing.Config {
	t.Helper()
	c, err := sharing.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// DGXA100 and DGXH100 are the labels of go-nvml's DGX mocks (8 GPUs)
// under driver 535.261.03: what the e2e asserts on the local node.
var (
	DGXA100 = map[string]string{
		"nvidia.com/cuda.driver-version.full":     "535.261.03",
		"nvidia.com/cuda.driver-version.major":    "535",
		"nvidia.com/cuda.driver-version.minor":    "261",
		"nvidia.com/cuda.driver-version.revision": "03",
		"nvidia.com/cuda.runtime-version.full":    "12.2",
		"nvidia.com/cuda.runtime-version.major":   "12",
		"nvidia.com/cuda.runtime-version.minor":   "2",
		"nvidia.com/gpu.product":                  "NVIDIA-A100-SXM4-80GB",
		"nvidia.com/gpu.count":                    "8",
		"nvidia.com/gpu.memory":                   "81920",
		"nvidia.com/gpu.replicas":                 "1",
		"nvidia.com/gpu.sharing-strategy":         "none",
		"nvidia.com/gpu.family":                   "ampere",
		"nvidia.com/gpu.compute.major":            "8",
		"nvidia.com/gpu.compute.minor":            "0",
		"nvidia.com/mig.capable":                  "true",
		"nvidia.com/mps.capable":                  "false",
	}
	DGXH100 = with(DGXA100, map[string]string{
		"nvidia.com/gpu.product":       "NVIDIA-H100-80GB-HBM3",
		"nvidia.com/gpu.family":        "hopper",
		"nvidia.com/gpu.compute.major": "9",
	})
)

// with is base with over's labels set (and those valued "" removed).
func with(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	for k, v := range over {
		if v == "" {
			delete(out, k)
			continue
		}
		out[k] = v
	}
	return out
}

func TestCompute(t *testing.T) {
	const driver = ",driver=535.261.03"
	tests := []struct {
		name  string
		facts func(t *testing.T) Facts
		want  map[string]string
	}{
		{"dgxa100", func(t *testing.T) Facts { return simFacts(t, "sim:a100-80gb*8"+driver, gpuselect.MIGNone) }, DGXA100},
		{"dgxh100", func(t *testing.T) Facts { return simFacts(t, "sim:h100-80gb*8"+driver, gpuselect.MIGNone) }, DGXH100},
		{"simulation's default driver", func(t *testing.T) Facts { return simFacts(t, "sim:a100-80gb*8", gpuselect.MIGNone) }, with(DGXA100, map[string]string{
			"nvidia.com/cuda.driver-version.full": "580.95.05", "nvidia.com/cuda.driver-version.major": "580",
			"nvidia.com/cuda.driver-version.minor": "95", "nvidia.com/cuda.driver-version.revision": "05",
			"nvidia.com/cuda.runtime-version.full": "13.0", "nvidia.com/cuda.runtime-version.major": "13", "nvidia.com/cuda.runtime-version.minor": "0",
		})},
		// none leaves MIG GPUs out: 6 whole GPUs.
		{"MIG under none", func(t *testing.T) Facts {
			return simFacts(t, "sim:a100-80gb*8,mig=0+1:3g.40gb*2"+driver, gpuselect.MIGNone)
		}, with(DGXA100, map[string]string{"nvidia.com/gpu.count": "6"})},
		// single: nvidia.com/gpu is the MIG devices.
		{"MIG under single", func(t *testing.T) Facts {
			return simFacts(t, "sim:a100-80gb*2,mig=0+1:3g.40gb*2"+driver, gpuselect.MIGSingle)
		}, with(DGXA100, map[string]string{
			"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
			"nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "40192", "nvidia.com/gpu.multiprocessors": "42",
			"nvidia.com/gpu.slices.gi": "3", "nvidia.com/gpu.slices.ci": "3",
		})},
		// mixed: whole GPUs count every GPU of the model, each profile its own resource.
		{"MIG under mixed", func(t *testing.T) Facts {
			return simFacts(t, "sim:a100-80gb*8,mig=0:1g.10gb+me+1g.10gb*6/1:3g.40gb*2"+driver, gpuselect.MIGMixed)
		}, with(DGXA100, map[string]string{
			"nvidia.com/mig.strategy":                    "mixed",
			"nvidia.com/mig-3g.40gb.product":             "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
			"nvidia.com/mig-3g.40gb.count":               "2",
			"nvidia.com/mig-3g.40gb.memory":              "40192",
			"nvidia.com/mig-3g.40gb.multiprocessors":     "42",
			"nvidia.com/mig-3g.40gb.replicas":            "1",
			"nvidia.com/mig-3g.40gb.sharing-strategy":    "none",
			"nvidia.com/mig-3g.40gb.slices.gi":           "3",
			"nvidia.com/mig-3g.40gb.slices.ci":           "3",
			"nvidia.com/mig-1g.10gb.product":             "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
			"nvidia.com/mig-1g.10gb.count":               "6",
			"nvidia.com/mig-1g.10gb.memory":              "9856",
			"nvidia.com/mig-1g.10gb.multiprocessors":     "14",
			"nvidia.com/mig-1g.10gb.replicas":            "1",
			"nvidia.com/mig-1g.10gb.sharing-strategy":    "none",
			"nvidia.com/mig-1g.10gb.slices.gi":           "1",
			"nvidia.com/mig-1g.10gb.slices.ci":           "1",
			"nvidia.com/mig-1g.10gb.me.product":          "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.me",
			"nvidia.com/mig-1g.10gb.me.count":            "1",
			"nvidia.com/mig-1g.10gb.me.memory":           "9856",
			"nvidia.com/mig-1g.10gb.me.multiprocessors":  "14",
			"nvidia.com/mig-1g.10gb.me.replicas":         "1",
			"nvidia.com/mig-1g.10gb.me.sharing-strategy": "none",
			"nvidia.com/mig-1g.10gb.me.slices.gi":        "1",
			"nvidia.com/mig-1g.10gb.me.slices.ci":        "1",
		})},
		{"time-sliced", func(t *testing.T) Facts {
			f := simFacts(t, "sim:a100-80gb*8"+driver, gpuselect.MIGNone)
			f.Sharing = sharingConfig(t, "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n")
			return f
		}, with(DGXA100, map[string]string{
			"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
		})},
		// A renamed shared resource is told apart by its name, not its product.
		{"time-sliced and renamed", func(t *testing.T) Facts {
			f := simFacts(t, "sim:a100-80gb*8"+driver, gpuselect.MIGNone)
			f.Sharing = sharingConfig(t, "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      rename: nvidia.com/gpu.shared\n      replicas: 2\n")
			return f
		}, with(DGXA100, map[string]string{"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "time-slicing"})},
		{"MPS", func(t *testing.T) Facts {
			f := simFacts(t, "sim:a100-80gb*8"+driver, gpuselect.MIGNone)
			f.Sharing = sharingConfig(t, "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n")
			f.MPS = true
			return f
		}, with(DGXA100, map[string]string{
			"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED", "nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/mps.capable": "true",
		})},
		// Nothing published: no labels, so the next apply removes them all.
		{"no GPUs", func(t *testing.T) Facts {
			f := simFacts(t, "sim:a100-80gb*8"+driver, gpuselect.MIGNone)
			f.Published = nil
			return f
		}, map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Compute(tt.facts(t))
			if !maps.Equal(r.Labels, tt.want) {
				t.Errorf("labels:\n got %v\nwant %v", r.Labels, tt.want)
				for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
					if r.Labels[k] != tt.want[k] {
						t.Errorf("  %s = %q, want %q", k, r.Labels[k], tt.want[k])
					}
				}
				for k := range tt.want {
					if _, ok := r.Labels[k]; !ok {
						t.Errorf("  %s missing", k)
					}
				}
			}
			if len(r.Models) > 0 || len(r.Invalid) > 0 {
				t.Errorf("models %v, invalid %v; want none", r.Models, r.Invalid)
			}
		})
	}
}

// Mixed models: the labels describe the first whole GPU's model, counted
// alone, and Models names them all for the warning.
func TestComputeMixedModels(t *testing.T) {
	a := gpu.Device{Name: "NVIDIA A100-SXM4-80GB", MemoryBytes: 80 << 30, ComputeCapability: "8.0", MIGCapable: true}
	h := gpu.Device{Name: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, ComputeCapability: "9.0"}
	migA := a
	migA.MIGEnabled = true
	f := Facts{Node: gpu.Node{DriverVersion: "535.261.03", CUDAVersion: "12.2", Devices: []gpu.Device{migA, h, a}},
		Published: []gpu.Device{migA, h, a}, MIG: gpuselect.MIGNone, ResourceName: contract.ResourceName}
	r := Compute(f)
	if got := r.Labels[contract.GFDLabelProduct]; got != "NVIDIA-H100-80GB-HBM3" {
		t.Errorf("product %q; want the first GPU with MIG off, NVIDIA-H100-80GB-HBM3", got)
	}
	if got := r.Labels[contract.GFDLabelCount]; got != "1" {
		t.Errorf("count %q; want 1 (the H100s)", got)
	}
	if r.Labels[contract.GFDLabelMIGCapable] != "true" {
		t.Errorf("mig.capable %q; want true (one GPU supports MIG)", r.Labels[contract.GFDLabelMIGCapable])
	}
	if !slices.Equal(r.Models, []string{a.Name, h.Name}) {
		t.Errorf("models %v; want both", r.Models)
	}
}

// A value that is no label value is left out and reported; a GPU NVML
// gives no compute capability for has no family.
func TestComputeInvalidValue(t *testing.T) {
	d := gpu.Device{Name: "NVIDIA " + strings.Repeat("X", 70), MemoryBytes: 1 << 30}
	r := Compute(Facts{Node: gpu.Node{DriverVersion: "535.261.03", CUDAVersion: "12.2", Devices: []gpu.Device{d}}, Published: []gpu.Device{d}, ResourceName: contract.ResourceName})
	if _, ok := r.Labels[contract.GFDLabelProduct]; ok || len(r.Invalid) != 1 || !strings.HasPrefix(r.Invalid[0], contract.GFDLabelProduct+"=") {
		t.Errorf("labels %v, invalid %v; want the 77-character product left out and reported", r.Labels, r.Invalid)
	}
	if _, ok := r.Labels[contract.GFDLabelFamily]; ok {
		t.Errorf("family %q without a compute capability", r.Labels[contract.GFDLabelFamily])
	}
	if r.Labels[contract.GFDLabelCount] != "1" || r.Labels[contract.GFDLabelMemory] != "1024" {
		t.Errorf("labels %v; want count 1 and memory 1024 still there", r.Labels)
	}
}
