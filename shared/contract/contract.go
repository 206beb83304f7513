// Package contract holds every fact nvinject's programs must agree on: the
// CDI kind, annotation keys and their encoding, environment names, metric
// names, containerd plugin IDs and Kubernetes names. The device plugin, the
// DRA driver, the NRI plugin, the doctor, deploy and the tests import it;
// none of them re-types these values.
package contract

import (
	"strconv"
	"strings"
)

// CDI kind of nvinject's GPU devices (vendor/class), the default of every
// program's --cdi-vendor and --cdi-class.
const (
	CDIVendor = "nvidia.com"
	CDIClass  = "gpu"
)

// CDIKind joins a vendor and class into a CDI kind ("nvidia.com/gpu").
func CDIKind(vendor, class string) string { return vendor + "/" + class }

// CDISpecDir is where the device plugin writes its spec; CDISpecDirs are
// the directories containerd and the NRI plugin read (containerd's default).
const CDISpecDir = "/var/run/cdi"

// MPSDir is the host directory under which nvinject runs MPS control
// daemons, one directory per daemon (its pipe, log and shm directories),
// mounted into the containers that share through it.
const MPSDir = "/run/nvinject/mps"

// CDISpecDirs returns containerd's default CDI spec directories.
func CDISpecDirs() []string { return []string{"/etc/cdi", "/var/run/cdi"} }

// Kubernetes names.
const (
	// ResourceName is the extended resource GPUs are published as.
	ResourceName = "nvidia.com/gpu"
	// RuntimeHandler is the RuntimeClass (and its containerd handler) whose
	// pods get GPUs.
	RuntimeHandler = "nvidia"
	// RequiredPluginsAnnotation makes containerd refuse a pod while a named
	// NRI plugin is not connected; nvidia pods carry it with NRIPluginName.
	RequiredPluginsAnnotation = "required-plugins.noderesource.dev/pod"
	// Namespace is where deploy/ puts nvinject's daemons.
	Namespace = "nvidia-device-plugin"
	// ConfigMapName and ConfigMapKey hold the selected GPU's UUID.
	ConfigMapName = "single-gpu-device-plugin"
	ConfigMapKey  = "selected-gpu-uuid"
	// AppLabel is the label key of the daemons' pods; DevicePluginApp,
	// DRAApp (dra.go) and NRIApp are its values, by which the doctor finds them.
	AppLabel        = "app.kubernetes.io/name"
	DevicePluginApp = "single-gpu-device-plugin"
	NRIApp          = "nvinject-nri"
	// DRADriver is nvinject's DRA driver name and DeviceClass name.
	DRADriver = "gpu.nvinject.io"
)

// NRI plugin identity: containerd runs it as <index>-<name>.
const (
	NRIPluginName  = "nvinject"
	NRIPluginIndex = "10"
)

// Default metrics ports of the two daemons.
const (
	DevicePluginMetricsPort = 9481
	NRIMetricsPort          = 9482
)

// Annotations nvinject writes or reads.
const (
	// AnnotationPrefix is the device plugin's name in its
	// cdi.k8s.io/<prefix>_<device-id> container annotation keys.
	AnnotationPrefix = "nvinject.gpu"
	// DevicesAnnotation carries the CDI names for the "nri" strategy. It is
	// not a cdi.k8s.io/ key, so containerd's own CDI leaves it alone.
	DevicesAnnotation = "nvinject.io/cdi-devices"
	// GPUUUIDsAnnotation is set by the NRI plugin on each GPU container: the
	// checked UUIDs, comma-separated.
	GPUUUIDsAnnotation = "nvinject.io/gpu-uuids"
	// GPUIndexAnnotation on a CDI device is the GPU's index, so kubelet's
	// index device IDs map to UUIDs.
	GPUIndexAnnotation = "nvinject.io/gpu-index"
	// MIGParentAnnotation and MIGProfileAnnotation on a MIG device's CDI
	// device are its parent GPU's UUID and its profile (1g.10gb).
	MIGParentAnnotation  = "nvinject.io/mig-parent"
	MIGProfileAnnotation = "nvinject.io/mig-profile"
	// SharedReplicasAnnotation on a GPU's or MIG device's CDI device is
	// how many containers of different pods may hold it at once under
	// time-slicing (absent: one).
	SharedReplicasAnnotation = "nvinject.io/shared-replicas"
	// MPSPipeDirAnnotation on a GPU's or MIG device's CDI device shared
	// through MPS is the host directory of its MPS control daemon's pipes
	// (MPSDir/<daemon>/pipe; its control socket is "control").
	MPSPipeDirAnnotation = "nvinject.io/mps-pipe-dir"
	// DriverVersionAnnotation on a CDI spec is the driver it was made from.
	DriverVersionAnnotation = "nvinject.io/driver-version"
	// SimulatedAnnotation marks a CDI spec made from a SIMULATED GPU.
	SimulatedAnnotation = "nvinject.io/simulated"
	// MoveFailedAnnotation on a Node holds why nvinject-move's last move or
	// upgrade of it failed (it leaves the node cordoned); the doctor's
	// fleet view reports it.
	MoveFailedAnnotation = "nvinject.io/move-failed"
)

// Environment the CDI spec sets in GPU containers.
const (
	// EnvUUIDPrefix + <minor> = <uuid>, one per injected GPU.
	EnvUUIDPrefix = "NVINJECT_GPU_UUID_"
	// EnvMIGUUIDPrefix + <minor> = <MIG uuid>, one per injected MIG device:
	// minor is that of the device's compute instance access node
	// (/dev/nvidia-caps/nvidia-cap<minor>), unique on the node; its parent's
	// /dev/nvidiaN comes with it and is named by no EnvUUIDPrefix variable.
	EnvMIGUUIDPrefix = "NVINJECT_MIG_UUID_"
	// EnvSimulated=1 marks a container given a SIMULATED GPU.
	EnvSimulated = "NVINJECT_SIMULATED"
	// EnvVisibleDevices is NVIDIA's selection variable; the spec sets it to
	// "void" so an installed NVIDIA runtime hook does not inject again.
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
)

// CapsDir holds the driver's MIG capability nodes (nvidia-cap<minor>).
const CapsDir = "/dev/nvidia-caps"

// MIGResourceName is the extended resource MIG devices of profile are
// published as under --mig-strategy=mixed, in the domain of the whole GPUs'
// resource: nvidia.com/gpu gives nvidia.com/mig-1g.10gb, NVIDIA's names. A
// resource name allows no '+', so media-extension profiles ("1g.10gb+me")
// read "mig-1g.10gb.me".
func MIGResourceName(gpuResource, profile string) string {
	domain, _, ok := strings.Cut(gpuResource, "/")
	if !ok {
		domain = CDIVendor
	}
	return domain + "/mig-" + strings.ReplaceAll(profile, "+", ".")
}

// MIGDeviceIndexID is a MIG device's ID under DEVICE_ID_STRATEGY=index and
// its CDI name under --device-name-strategy=index: NVIDIA's
// "<gpu index>:<MIG device index on the GPU>".
func MIGDeviceIndexID(gpuIndex, migIndex int) string {
	return strconv.Itoa(gpuIndex) + ":" + strconv.Itoa(migIndex)
}

// containerd plugin IDs in config.toml (version 3).
const (
	ContainerdNRI        = "io.containerd.nri.v1.nri"
	ContainerdCRIRuntime = "io.containerd.cri.v1.runtime"
	ContainerdCRIImages  = "io.containerd.cri.v1.images"
	// ContainerdCRILegacy is the CRI plugin ID of version 2 configs.
	ContainerdCRILegacy = "io.containerd.grpc.v1.cri"
	ContainerdRuncShim  = "io.containerd.runc.v2"
)

// SimulatedNVML starts every --nvml value that names a SIMULATED node
// ("sim:a100-80gb*8"): test and demo equipment, linked only into builds
// without the nosim tag (see shared/gpu/backend).
const SimulatedNVML = "sim:"

// IsSimulatedNVML says whether an --nvml value names a SIMULATED node.
func IsSimulatedNVML(v string) bool { return strings.HasPrefix(v, SimulatedNVML) }
