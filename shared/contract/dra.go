package contract

import (
	"fmt"
	"strconv"
	"strings"
)

// DRA facts: the driver's socket layout, the ResourceSlice's device naming,
// attributes and taint, and the DRA driver's metrics. DRADriver (the driver
// and DeviceClass name) is in contract.go.
const (
	// DRAApp is the app label of the DRA driver DaemonSet's pods.
	DRAApp = "nvinject-dra"
	// DRAMetricsPort is the DRA driver's default metrics port.
	DRAMetricsPort = 9483
	// DRAModeLabel on a Node says which nvinject component owns its GPUs:
	// DRAModeDevicePlugin or DRAModeDRA. deploy/ schedules each DaemonSet by it.
	DRAModeLabel        = "nvinject.io/gpu-mode"
	DRAModeDevicePlugin = "device-plugin"
	DRAModeDRA          = "dra"
	// DRADevicePrefix + the GPU's index is its device name in the
	// ResourceSlice ("gpu-0"): UUIDs are not DNS labels.
	DRADevicePrefix = "gpu-"
	// DRATaintKey is the device taint the driver sets while a GPU is
	// Unhealthy; its value says why (xid, gpu-lost, monitoring).
	DRATaintKey = "gpu.nvinject.io/unhealthy"
	// DRAHeldTaintKey is the device taint the driver sets while a pod that
	// got the GPU through the device plugin still runs (the node moved to
	// DRA under it), so no claim hands the GPU out a second time.
	DRAHeldTaintKey   = "gpu.nvinject.io/device-plugin-pod"
	DRAHeldTaintValue = "running"
	// DRAHeldTaintUnknown is that taint's value on every device while the
	// driver cannot read kubelet's PodResources: it cannot tell which GPUs
	// device-plugin pods hold, so it offers none (fail closed).
	DRAHeldTaintUnknown = "unknown"
)

// DRADeviceName is the ResourceSlice device name of the GPU with NVML index i.
func DRADeviceName(i int) string { return DRADevicePrefix + strconv.Itoa(i) }

// DRAMIGDeviceName is the ResourceSlice device name of the MIG device with
// GPU instance gi and compute instance ci on the GPU with NVML index parent:
// "gpu-1-mig-3g40gb-gi1-ci0". The profile is there for people; GI and CI
// make it unique on the parent. Profiles hold '.' and '+' ("1g.10gb+me"),
// which a DNS label does not: dots go, '+' becomes '-'.
func DRAMIGDeviceName(parent int, profile string, gi, ci int) string {
	p := strings.NewReplacer(".", "", "+", "-").Replace(strings.ToLower(profile))
	return DRADeviceName(parent) + "-mig-" + p + "-gi" + strconv.Itoa(gi) + "-ci" + strconv.Itoa(ci)
}

// DRAMIGSlotDeviceName is the ResourceSlice device of the placement at
// memory slice start where a MIG device of profile can be made on demand on
// the GPU with NVML index parent: "gpu-1-mig-1g10gb-at2".
func DRAMIGSlotDeviceName(parent int, profile string, start int) string {
	p := strings.NewReplacer(".", "", "+", "-").Replace(strings.ToLower(profile))
	return DRADeviceName(parent) + "-mig-" + p + "-at" + strconv.Itoa(start)
}

// DRAShareDeviceName is the ResourceSlice device of the GPU with NVML index
// i that many claims share by consumable capacity (KEP-5075): "gpu-0-share".
func DRAShareDeviceName(i int) string { return DRADeviceName(i) + "-share" }

// DRAShareClass is the DeviceClass of the GPUs' share devices; DRADriver's
// own class selects whole GPUs and MIG devices only.
const DRAShareClass = "gpu-share.nvinject.io"

// DRACounterSetName is the ResourceSlice counter set (KEP-4815) of the GPU
// with NVML index i: its memory and memory slices, which its whole device
// or its MIG devices consume.
func DRACounterSetName(i int) string { return DRADeviceName(i) }

// Device attribute and capacity names in the driver's domain (DRADriver).
const (
	DRAAttrUUID              = "uuid"
	DRAAttrProductName       = "productName"
	DRAAttrIndex             = "index"
	DRAAttrMinor             = "minor"
	DRAAttrDriverVersion     = "driverVersion"
	DRAAttrCUDADriverVersion = "cudaDriverVersion"
	DRAAttrArchitecture      = "architecture"
	DRAAttrComputeCapability = "cudaComputeCapability"
	DRAAttrNUMANode          = "numaNode"
	DRACapacityMemory        = "memory"
	// DRAAttrType is DRATypeGPU on a whole GPU, DRATypeMIG on a MIG device,
	// DRATypeShare on a GPU's share device.
	DRAAttrType  = "type"
	DRATypeGPU   = "gpu"
	DRATypeMIG   = "mig"
	DRATypeShare = "share"
	// DRACapacityComputePercent is a share device's compute capacity (100):
	// a share's part of it is its MPS daemon's active thread percentage.
	DRACapacityComputePercent = "computePercent"
	// DRAAttrMIGCapable is whether the GPU (a MIG device's parent) supports
	// MIG: the node label nvidia.com/mig.capable, per device.
	DRAAttrMIGCapable = "migCapable"
	// MIG devices' own attributes and capacity.
	DRAAttrParentUUID          = "parentUUID"
	DRAAttrParentIndex         = "parentIndex"
	DRAAttrProfile             = "profile"
	DRAAttrMIGGI               = "migGI"
	DRAAttrMIGCI               = "migCI"
	DRACapacityMultiprocessors = "multiprocessors"
	// A placement where a MIG device is made on demand: migOnDemand true,
	// and the GPU instance's first memory slice and slice count.
	DRAAttrMIGOnDemand    = "migOnDemand"
	DRAAttrPlacementStart = "placementStart"
	DRAAttrPlacementSize  = "placementSize"
	// DRACounterMemory (bytes) and DRACounterMemorySlice + <i> (one per
	// memory slice a GPU instance occupies) are the counters of a GPU's
	// counter set.
	DRACounterMemory      = "memory"
	DRACounterMemorySlice = "memory-slice-"
	// DRACounterShare is the counter of a GPU without MIG whose share
	// device is published: its whole device and its share device consume
	// it so that they never fit together.
	DRACounterShare = "gpu"
)

// Metric names of nvinject-dra.
const (
	MetricDRAPrepares         = "nvinject_dra_prepare_total"
	MetricDRAUnprepares       = "nvinject_dra_unprepare_total"
	MetricDRAPrepared         = "nvinject_dra_prepared_claims"
	MetricDRADeviceHealthy    = "nvinject_dra_device_healthy"
	MetricDRAHealthStreams    = "nvinject_dra_health_streams"
	MetricDRABackgroundErrors = "nvinject_dra_background_errors_total"
	MetricDRAHealthEvents     = "nvinject_dra_health_events_total"
	MetricDRAHealthCoalesced  = "nvinject_dra_health_updates_coalesced_total"
	MetricDRARegistered       = "nvinject_dra_registered"
	MetricDRARepublishes      = "nvinject_dra_republishes_total"
	MetricDRALabelApplies     = "nvinject_dra_node_label_applies_total"
)

// DRASemVer turns NVIDIA's dotted versions ("580.95.05", "13.0", "8.0") into
// the semantic versions a DRA VersionValue attribute carries ("580.95.5", "13.0.0", "8.0.0").
func DRASemVer(v string) (string, bool) {
	parts := strings.Split(v, ".")
	if v == "" || len(parts) > 3 {
		return "", false
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return "", false
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return fmt.Sprintf("%s.%s.%s", parts[0], parts[1], parts[2]), true
}
