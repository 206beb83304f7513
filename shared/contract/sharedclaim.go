package contract

import (
	"slices"
	"strings"
)

// A ResourceClaim of DRADriver that several pods share (its opaque
// GpuConfig says sharing TimeSlicing): nvinject-dra prepares it with one
// more CDI device, the claim's own, that tells nvinject-nri the claim's
// GPUs are shared by exactly the pods of that claim.
const (
	// DRAConfigAPIVersion and DRAConfigKind name the opaque driver config
	// of a claim (spec.devices.config[].opaque.parameters).
	DRAConfigAPIVersion = DRADriver + "/v1alpha1"
	DRAConfigKind       = "GpuConfig"
	// CDIClaimClass is the CDI class of the per-claim devices:
	// <vendor>/claim=<claim UID>. Its own class keeps them apart from the
	// GPU devices (vendor/gpu), which each stand for a GPU.
	CDIClaimClass = "claim"
	// SharedClaimAnnotation on a per-claim CDI device is the UID of the
	// claim whose pods may share its GPUs.
	SharedClaimAnnotation = "nvinject.io/shared-claim"
	// SharedClaimUUIDsAnnotation on a per-claim CDI device lists the GPU
	// and MIG UUIDs the claim shares, comma-separated and sorted.
	SharedClaimUUIDsAnnotation = "nvinject.io/shared-claim-uuids"
	// EnvSharedClaim = <claim UID> in each container of a shared claim.
	EnvSharedClaim = "NVINJECT_SHARED_CLAIM"
	// GPUShareAnnotation on a per-claim CDI device is the allocation's
	// share ID when the claim holds a GPU share (consumable capacity): the
	// GPU then serves the pods of every share claim on it, and no pod that
	// holds it whole.
	GPUShareAnnotation = "nvinject.io/gpu-share"
	// AdminAccessAnnotation = "true" on a per-claim CDI device of a claim
	// allocated with admin access (KEP-5018): its pods may use GPUs that
	// other pods hold, to monitor them; the API server admits such claims
	// only in namespaces labeled resource.kubernetes.io/admin-access=true.
	AdminAccessAnnotation = "nvinject.io/admin-access"
)

// SharedClaimDevice is the qualified CDI name of claim uid's own device.
func SharedClaimDevice(vendor, uid string) string {
	return CDIKind(vendor, CDIClaimClass) + "=" + uid
}

// SharedClaimUUIDs encodes the UUIDs for SharedClaimUUIDsAnnotation.
func SharedClaimUUIDs(uuids []string) string {
	return strings.Join(slices.Compact(slices.Sorted(slices.Values(uuids))), ",")
}

// ParseSharedClaimUUIDs reads a SharedClaimUUIDsAnnotation value; empty
// entries are dropped.
func ParseSharedClaimUUIDs(v string) []string {
	return slices.DeleteFunc(strings.Split(v, ","), func(s string) bool { return s == "" })
}
