package evidence

// ModeEvidence says which nvinject component owns the node's GPUs, and how
// the doctor knows.
type ModeEvidence struct {
	// Mode is contract.DRAModeDevicePlugin or contract.DRAModeDRA.
	Mode   string `json:"mode"`
	Source string `json:"source"`
}

// DRAEvidence is what the doctor reads on a DRA-mode node.
type DRAEvidence struct {
	Metrics DRAMetricsEvidence  `json:"metrics"`
	Slices  SliceEvidence       `json:"resourceSlices"`
	Class   DeviceClassEvidence `json:"deviceClass"`
	Claims  ClaimsEvidence      `json:"claims"`
}

// DRAMetricsEvidence is read from nvinject-dra's /metrics; a nil pointer
// means the metric was absent.
type DRAMetricsEvidence struct {
	URL           string         `json:"url"`
	Unread        string         `json:"unread,omitempty"`
	Registered    *float64       `json:"registered,omitempty"`
	Prepared      *float64       `json:"preparedClaims,omitempty"`
	PrepareErrors *float64       `json:"prepareErrors,omitempty"`
	HealthStreams *float64       `json:"healthStreams,omitempty"`
	Devices       []DeviceHealth `json:"devices,omitempty"`
	HealthEvents  []string       `json:"healthEvents,omitempty"`
}

// SliceDevice is one device of the driver's ResourceSlices for the node.
type SliceDevice struct {
	Pool   string `json:"pool"`
	Name   string `json:"name"`
	UUID   string `json:"uuid,omitempty"`
	Memory string `json:"memory,omitempty"`
	// Type is contract.DRATypeGPU or DRATypeMIG; Profile a MIG device's.
	Type    string `json:"type,omitempty"`
	Profile string `json:"profile,omitempty"`
	// Taints are "key=value:effect".
	Taints []string `json:"taints,omitempty"`
}

// ID is the device as allocation results name it: pool/device.
func (d SliceDevice) ID() string { return d.Pool + "/" + d.Name }

// SliceEvidence is the driver's ResourceSlices for the node.
type SliceEvidence struct {
	Unread  string        `json:"unread,omitempty"`
	Slices  []string      `json:"slices,omitempty"`
	Devices []SliceDevice `json:"devices,omitempty"`
}

// DeviceClassEvidence is the driver's DeviceClass.
type DeviceClassEvidence struct {
	Name                 string `json:"name"`
	Unread               string `json:"unread,omitempty"`
	Exists               bool   `json:"exists"`
	ExtendedResourceName string `json:"extendedResourceName,omitempty"`
}

// ClaimDevice is one allocation result of a claim.
type ClaimDevice struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	// ShareID and Consumed are a share of a device that allows multiple
	// allocations (a GPU's share device): its ID and what it consumes
	// ("memory=40Gi", "computePercent=50", sorted).
	ShareID  string   `json:"shareID,omitempty"`
	Consumed []string `json:"consumed,omitempty"`
	// AdminAccess: allocated for monitoring beside the device's holders.
	AdminAccess bool `json:"adminAccess,omitempty"`
}

// ID is pool/device, as SliceDevice.ID.
func (d ClaimDevice) ID() string { return d.Pool + "/" + d.Device }

// Claim is a ResourceClaim that concerns the node: allocated from its
// ResourceSlices, or used by a pod bound to it.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Extended is a claim the scheduler made for a pod's nvidia.com/gpu
	// request (KEP-5004).
	Extended  bool          `json:"extended,omitempty"`
	Allocated bool          `json:"allocated"`
	Devices   []ClaimDevice `json:"devices,omitempty"`
	// ReservedFor are the pods the claim is reserved for (namespace/name).
	ReservedFor []string `json:"reservedFor,omitempty"`
	// Pods are the node's pods whose status names the claim.
	Pods []PodRef `json:"pods,omitempty"`
}

func (c Claim) String() string { return c.Namespace + "/" + c.Name }

// ResourceHealth is one device's health in a container's
// allocatedResourcesStatus (KEP-4680).
type ResourceHealth struct {
	PodRef
	// Resource is the status entry's name, "claim:<claim>/<request>".
	Resource string `json:"resource"`
	ID       string `json:"id"`
	Health   string `json:"health"`
}

// ClaimsEvidence is the node's claims and their containers' device health.
type ClaimsEvidence struct {
	Unread string           `json:"unread,omitempty"`
	Claims []Claim          `json:"claims,omitempty"`
	Health []ResourceHealth `json:"health,omitempty"`
}
