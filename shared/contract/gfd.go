package contract

// Node labels in NVIDIA GPU feature discovery's names, so node selectors
// and affinities written for NVIDIA's stack select nvinject's nodes too.
// Both kubelet plugins publish them for their node; the fleet tools read
// them back.
const (
	GFDLabelProduct       = "nvidia.com/gpu.product"
	GFDLabelMemory        = "nvidia.com/gpu.memory" // MiB
	GFDLabelCount         = "nvidia.com/gpu.count"
	GFDLabelDriverVersion = "nvidia.com/cuda.driver-version.full"
	// GFDLabelCUDAVersion is the CUDA driver API version the driver
	// supports (cuDriverGetVersion), "12.2"; GFD calls it the runtime version.
	GFDLabelCUDAVersion = "nvidia.com/cuda.runtime-version.full"
	GFDLabelMIGCapable  = "nvidia.com/mig.capable"
)
