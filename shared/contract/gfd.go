package contract

// Node labels in NVIDIA GPU feature discovery's names, so node selectors
// and affinities written for NVIDIA's stack select nvinject's nodes too.
// Both kubelet plugins publish them for their node (gpunode/nodelabels);
// the fleet tools read them back.
const (
	// GFDLabelPresent=true marks a GPU node (GFD, the GPU operator or the
	// admin sets it); deploy/'s DaemonSets select their nodes by it.
	GFDLabelPresent       = "nvidia.com/gpu.present"
	GFDLabelProduct       = "nvidia.com/gpu.product"
	GFDLabelMemory        = "nvidia.com/gpu.memory" // MiB
	GFDLabelCount         = "nvidia.com/gpu.count"
	GFDLabelDriverVersion = "nvidia.com/cuda.driver-version.full"
	// GFDLabelCUDAVersion is the CUDA driver API version the driver
	// supports (cuDriverGetVersion), "12.2"; GFD calls it the runtime version.
	GFDLabelCUDAVersion = "nvidia.com/cuda.runtime-version.full"
	GFDLabelMIGCapable  = "nvidia.com/mig.capable"

	GFDLabelDriverMajor    = "nvidia.com/cuda.driver-version.major"
	GFDLabelDriverMinor    = "nvidia.com/cuda.driver-version.minor"
	GFDLabelDriverRevision = "nvidia.com/cuda.driver-version.revision"
	GFDLabelCUDAMajor      = "nvidia.com/cuda.runtime-version.major"
	GFDLabelCUDAMinor      = "nvidia.com/cuda.runtime-version.minor"
	// GFDLabelFamily is the architecture family from the compute
	// capability, lower case: "ampere", "hopper".
	GFDLabelFamily       = "nvidia.com/gpu.family"
	GFDLabelComputeMajor = "nvidia.com/gpu.compute.major"
	GFDLabelComputeMinor = "nvidia.com/gpu.compute.minor"
	// GFDLabelReplicas is how many replicas each GPU of the resource is
	// shared as (1 unshared); GFDLabelSharingStrategy "none",
	// "time-slicing" or "mps".
	GFDLabelReplicas        = "nvidia.com/gpu.replicas"
	GFDLabelSharingStrategy = "nvidia.com/gpu.sharing-strategy"
	GFDLabelMPSCapable      = "nvidia.com/mps.capable"
	// GFDLabelMIGStrategy is set under MIG_STRATEGY single or mixed only.
	GFDLabelMIGStrategy = "nvidia.com/mig.strategy"
)

// GFD's per-resource label suffixes: GFD names a resource's labels
// <resource>.<suffix>, nvidia.com/gpu.count or, under MIG_STRATEGY=mixed,
// nvidia.com/mig-1g.10gb.count. The MIG ones describe one MIG device.
const (
	GFDSuffixProduct         = "product"
	GFDSuffixCount           = "count"
	GFDSuffixMemory          = "memory"
	GFDSuffixReplicas        = "replicas"
	GFDSuffixSharingStrategy = "sharing-strategy"
	GFDSuffixMultiprocessors = "multiprocessors"
	GFDSuffixSlicesGI        = "slices.gi"
	GFDSuffixSlicesCI        = "slices.ci"
)

// GFDGPUResource is the resource GFD's whole-GPU (and MIG single) labels
// are named after, whatever --resource-name publishes.
const GFDGPUResource = "nvidia.com/gpu"

// GFDMIGResource is the resource GFD names a MIG profile's labels after
// under MIG_STRATEGY=mixed: nvidia.com/mig-1g.10gb, and nvidia.com/mig-1g.10gb.me
// for "1g.10gb+me".
func GFDMIGResource(profile string) string { return MIGResourceName(GFDGPUResource, profile) }

// NodeLabelManager is the server-side apply field manager both kubelet
// plugins publish their Node's labels under: whichever serves the node now
// owns them, and a label the last apply left out is removed.
const NodeLabelManager = "nvinject.io/gpu-labels"
