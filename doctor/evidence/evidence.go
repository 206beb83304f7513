// Package evidence is what the doctor reads about a node or a pod, as plain
// data: the collectors fill it, the checks judge it, the JSON report carries
// it. It does no I/O and imports no other doctor package, so a check over it
// cannot reach back into a collector.
package evidence

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nvinject/nvinject/shared/contract"
)

// Evidence is everything the collectors read about one node. Every part has
// an Unread field: empty when the part was read, otherwise why it could not
// be (the checks turn that into an "unknown" verdict, never an "ok").
type Evidence struct {
	Node         string               `json:"node"`
	Resource     string               `json:"resource"`
	RuntimeClass string               `json:"runtimeClass"`
	SMI          SMIEvidence          `json:"nvidiaSmi"`
	KubeletDir   KubeletDirEvidence   `json:"kubeletDir"`
	Plugin       PluginEvidence       `json:"devicePlugin"`
	PluginPod    DaemonEvidence       `json:"devicePluginPod"`
	NRIPod       DaemonEvidence       `json:"nriPod"`
	NodeStatus   NodeEvidence         `json:"nodeStatus"`
	Selected     SelectedEvidence     `json:"selectedGpu"`
	Ledger       LedgerEvidence       `json:"ledger"`
	Allocate     AllocateEvidence     `json:"allocate"`
	CDI          CDIEvidence          `json:"cdi"`
	RuntimeCls   RuntimeClassEvidence `json:"runtimeClassObject"`
	Containerd   ContainerdEvidence   `json:"containerd"`
	NRI          NRIEvidence          `json:"nri"`
	App          AppEvidence          `json:"application"`
	// PodResources is kubelet's assignment of devices to containers.
	PodResources PodResourcesEvidence `json:"podResources"`
	// Mode says whether the device plugin or nvinject-dra owns the node's
	// GPUs; the DRA layers read DRAPod and DRA (collected in DRA mode only).
	Mode   ModeEvidence   `json:"mode"`
	DRAPod DaemonEvidence `json:"draPod"`
	DRA    *DRAEvidence   `json:"dra,omitempty"`
	// DriverRoot is the driver the node has installed, which the daemon's
	// CDI spec must have been made from.
	DriverRoot DriverRootEvidence `json:"driverRoot"`
}

// DriverRootEvidence is the NVIDIA driver installed in a driver root.
type DriverRootEvidence struct {
	// Root is the driver root as the doctor sees it; Source says where it
	// came from (--driver-root, the daemon's pod, the default).
	Root   string `json:"root"`
	Source string `json:"source"`
	Unread string `json:"unread,omitempty"`
	// Version and File are the installed driver's version and the library
	// it was read from; both empty when the root holds no NVIDIA driver.
	Version string `json:"version,omitempty"`
	File    string `json:"file,omitempty"`
}

// SpecOwner is the daemon that writes the node's CDI spec: nvinject-dra on
// a DRA-mode node, else the device plugin.
func (e Evidence) SpecOwner() DaemonEvidence {
	if e.Mode.Mode == contract.DRAModeDRA {
		return e.DRAPod
	}
	return e.PluginPod
}

// GPU is one line of nvidia-smi's query output.
type GPU struct {
	Index   string `json:"index"`
	UUID    string `json:"uuid"`
	Name    string `json:"name"`
	MIGMode string `json:"migMode,omitempty"`
	// MIGPending is the MIG mode the GPU takes at its next reset.
	MIGPending string `json:"migPending,omitempty"`
}

// SMIEvidence is the result of running nvidia-smi on the worker.
type SMIEvidence struct {
	Path   string `json:"path"`
	Unread string `json:"unread,omitempty"`
	// Failed is set when nvidia-smi ran and exited non-zero.
	Failed string `json:"failed,omitempty"`
	Output string `json:"output,omitempty"`
	GPUs   []GPU  `json:"gpus,omitempty"`
	// MIGDevices are the live MIG devices (nvidia-smi -L), listed only when
	// a GPU has MIG mode on; MIGUnread says why they could not be.
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
	MIGUnread  string      `json:"migUnread,omitempty"`
}

// MIGDevice is one MIG device the driver has.
type MIGDevice struct {
	// Parent is its GPU's UUID.
	Parent  string `json:"parent"`
	Profile string `json:"profile"`
	UUID    string `json:"uuid"`
}

// KubeletDirEvidence is what the kubelet device-plugins directory holds.
type KubeletDirEvidence struct {
	Dir           string   `json:"dir"`
	Unread        string   `json:"unread,omitempty"`
	KubeletSocket bool     `json:"kubeletSocket"`
	PluginSockets []string `json:"pluginSockets,omitempty"`
}

// DeviceHealth is one device as the device plugin reports it.
type DeviceHealth struct {
	UUID    string `json:"uuid"`
	Healthy bool   `json:"healthy"`
}

// PluginEvidence is read from nvinject-device-plugin's /metrics. A nil
// pointer means the metric was absent.
type PluginEvidence struct {
	URL                string         `json:"url"`
	Unread             string         `json:"unread,omitempty"`
	Registrations      *float64       `json:"registrations,omitempty"`
	RegistrationErrors *float64       `json:"registrationErrors,omitempty"`
	Streams            *float64       `json:"listAndWatchStreams,omitempty"`
	Devices            []DeviceHealth `json:"devices,omitempty"`
	// HealthEvents are the health events the policy did not ignore
	// ("xid 79", "gpu-lost"); the plugin counts them per node, not per GPU.
	HealthEvents   []string `json:"healthEvents,omitempty"`
	AllocateErrors *float64 `json:"allocateErrors,omitempty"`
	// Held are the GPUs the plugin publishes Unhealthy because another path
	// holds them, not for their health (contract.MetricGPUHeld).
	Held []HeldGPU `json:"heldGpus,omitempty"`
}

// HeldGPU is one GPU the device plugin withholds: Holder is
// contract.HeldByDRAClaim (Pod and Claim name it) or contract.HeldUnknown
// (the plugin cannot read kubelet's PodResources).
type HeldGPU struct {
	UUID   string `json:"uuid"`
	Holder string `json:"holder"`
	Pod    string `json:"pod,omitempty"`
	Claim  string `json:"claim,omitempty"`
}

// NodeEvidence is the Node's published amount of the GPU resource.
type NodeEvidence struct {
	Unread      string `json:"unread,omitempty"`
	Published   bool   `json:"published"`
	Capacity    int64  `json:"capacity"`
	Allocatable int64  `json:"allocatable"`
	// ModeLabel is the Node's contract.DRAModeLabel value.
	ModeLabel string `json:"modeLabel,omitempty"`
	// MIGCapacity is the capacity of each MIG resource the Node publishes
	// (contract.MIGResourceName: MIG_STRATEGY=mixed).
	MIGCapacity map[string]int64 `json:"migCapacity,omitempty"`
}

// SelectedEvidence is the ConfigMap value that limits the plugin's view.
type SelectedEvidence struct {
	Source string   `json:"source"`
	Unread string   `json:"unread,omitempty"`
	UUIDs  []string `json:"uuids,omitempty"`
	All    bool     `json:"all,omitempty"`
}

// PodRef names a pod and, where it matters, one of its containers.
type PodRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Container string `json:"container,omitempty"`
}

func (p PodRef) String() string {
	s := p.Namespace + "/" + p.Name
	if p.Container != "" {
		s += "[" + p.Container + "]"
	}
	return s
}

// PodMessage is a pod (or container) with the message that concerns it.
type PodMessage struct {
	PodRef
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message"`
}

// GPUHolder is a pod bound to the node that requests GPUs.
type GPUHolder struct {
	PodRef
	Phase string `json:"phase"`
	GPUs  int64  `json:"gpus"`
}

// LedgerEvidence is the scheduler's view: who holds the node's GPUs and who
// waits for one.
type LedgerEvidence struct {
	Unread  string       `json:"unread,omitempty"`
	Holders []GPUHolder  `json:"holders,omitempty"`
	Pending []PodMessage `json:"pending,omitempty"`
}

// AllocateEvidence lists pods kubelet rejected because Allocate failed, and
// those it could not prepare DRA claims for (FailedPrepareDynamicResources).
type AllocateEvidence struct {
	Unread          string       `json:"unread,omitempty"`
	Failures        []PodMessage `json:"failures,omitempty"`
	PrepareFailures []PodMessage `json:"prepareFailures,omitempty"`
}

// SpecError is one CDI spec file the CDI library refused.
type SpecError struct {
	Path  string `json:"path"`
	Error string `json:"error"`
}

// CDIEvidence is what the CDI library makes of the spec directories.
type CDIEvidence struct {
	Dirs        []string    `json:"dirs"`
	Unread      string      `json:"unread,omitempty"`
	MissingDirs []string    `json:"missingDirs,omitempty"`
	Files       []string    `json:"files,omitempty"`
	Errors      []SpecError `json:"errors,omitempty"`
	Devices     []string    `json:"devices,omitempty"`
	// Wanted are the names pods need (from the selected UUIDs, the plugin's
	// devices and container errors); Unresolved those the cache lacks.
	Wanted     []string `json:"wanted,omitempty"`
	Unresolved []string `json:"unresolved,omitempty"`
	// GPUDevices are the GPUs and MIG devices of nvinject's CDI kind.
	GPUDevices []CDIDevice `json:"gpuDevices,omitempty"`

	// RuntimeDirs are the spec dirs in the order containerd reads them
	// (its cdi_spec_dirs, else the doctor's): of two specs defining one
	// device, the one in the later dir wins. Specs, Shadowed and OwnSpec
	// are read from them; RuntimeUnread says why they could not be.
	RuntimeDirs   []string `json:"runtimeDirs,omitempty"`
	RuntimeUnread string   `json:"runtimeUnread,omitempty"`
	// Specs are the spec files that loaded, in the order containerd reads
	// them; a file that did not load is in Errors.
	Specs []SpecFile `json:"specs,omitempty"`
	// OwnSpec is the path of the spec the node's nvinject daemon writes
	// (its --cdi-spec-dir, the file name cdi/spec.FileName gives).
	OwnSpec string `json:"ownSpec,omitempty"`
	// Shadowed are devices more than one spec file defines, the daemon's
	// lost ones first, at most a few; ShadowedTotal counts them all and
	// OwnLost the daemon's devices the runtime takes from another file or
	// from none.
	Shadowed      []ShadowedDevice `json:"shadowed,omitempty"`
	ShadowedTotal int              `json:"shadowedTotal,omitempty"`
	OwnLost       int              `json:"ownLost,omitempty"`
}

// SpecFile is one CDI spec file that loaded.
type SpecFile struct {
	Path string `json:"path"`
	// Priority is its dir's index in RuntimeDirs.
	Priority int    `json:"priority"`
	Kind     string `json:"kind"`
	Devices  int    `json:"devices"`
	// DriverVersion is its contract.DriverVersionAnnotation: the driver
	// nvinject's generator made it from.
	DriverVersion string `json:"driverVersion,omitempty"`
}

// ShadowedDevice is a fully qualified CDI device ("nvidia.com/gpu=<uuid>")
// that more than one spec file defines.
type ShadowedDevice struct {
	Name string `json:"name"`
	// Files define it, in the order containerd reads them.
	Files []string `json:"files"`
	// Winner is the file whose device containerd uses; empty when two
	// files of one dir define it, which makes the CDI library drop it.
	Winner string `json:"winner,omitempty"`
	// Own says the daemon's spec (CDIEvidence.OwnSpec) is among Files.
	Own bool `json:"own,omitempty"`
}

// Lost says whether the daemon's spec own defines d, for a name nvinject
// hands out, but the runtime resolves it to another file or to none. Its
// "all" device is in its spec for hand use only, so losing it is harmless.
func (d ShadowedDevice) Lost(own string) bool {
	_, name, _ := strings.Cut(d.Name, "=")
	return d.Own && d.Winner != own && name != "all"
}

// CDIDevice is one GPU or MIG device in the CDI specs, with the names it is
// known by (its UUID, and its index under --device-name-strategy=index).
type CDIDevice struct {
	UUID  string   `json:"uuid"`
	Names []string `json:"names"`
	// Parent and Profile are set on a MIG device
	// (contract.MIGParentAnnotation, MIGProfileAnnotation).
	Parent  string `json:"parent,omitempty"`
	Profile string `json:"profile,omitempty"`
	// Replicas is contract.SharedReplicasAnnotation: how many pods may hold
	// the device at once (0: not shared, one).
	Replicas int `json:"replicas,omitempty"`
	// MPS is the MPS control daemon the device is shared through
	// (contract.MPSPipeDirAnnotation).
	MPS *MPSDaemon `json:"mps,omitempty"`
}

// MPSDaemon is an MPS control daemon as its control socket answers.
type MPSDaemon struct {
	PipeDir string `json:"pipeDir"`
	// Down says why PipeDir/control takes no connection (missing,
	// refused); Unread why the doctor could not tell.
	Down   string `json:"down,omitempty"`
	Unread string `json:"unread,omitempty"`
}

// PodResourcesEvidence is kubelet's PodResources List: which container
// holds which device-plugin devices.
type PodResourcesEvidence struct {
	Socket     string             `json:"socket"`
	Unread     string             `json:"unread,omitempty"`
	Containers []ContainerDevices `json:"containers,omitempty"`
}

// ContainerDevices are the device IDs of one resource kubelet assigned a
// container (a GPU's UUID or index, a replica's "<id>::<n>").
type ContainerDevices struct {
	PodRef
	Resource string   `json:"resource"`
	IDs      []string `json:"ids"`
}

// RuntimeClassEvidence is the RuntimeClass object pods name.
type RuntimeClassEvidence struct {
	Unread  string `json:"unread,omitempty"`
	Exists  bool   `json:"exists"`
	Handler string `json:"handler,omitempty"`
}

// ContainerdEvidence is the merged containerd configuration.
type ContainerdEvidence struct {
	Path        string   `json:"path"`
	Unread      string   `json:"unread,omitempty"`
	Files       []string `json:"files,omitempty"`
	Handlers    []string `json:"handlers,omitempty"`
	CDISpecDirs []string `json:"cdiSpecDirs,omitempty"`
	NRIDisabled bool     `json:"nriDisabled,omitempty"`
}

// NRIEvidence is nvinject-nri's metrics and the container errors on the node
// (refusals and CDI/runtime failures) as kubelet reports them.
type NRIEvidence struct {
	URL           string             `json:"url"`
	MetricsUnread string             `json:"metricsUnread,omitempty"`
	Connected     *float64           `json:"connected,omitempty"`
	Refusals      map[string]float64 `json:"refusals,omitempty"`
	ErrorsUnread  string             `json:"errorsUnread,omitempty"`
	// CreateErrors are containers that failed to be created, with kubelet's
	// message (CreateContainerError and friends, and Failed events).
	CreateErrors []PodMessage `json:"createErrors,omitempty"`
}

// ContainerState is one container of an application pod.
type ContainerState struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	ExitCode int32  `json:"exitCode,omitempty"`
	Restarts int32  `json:"restarts"`
	Ready    bool   `json:"ready"`
	// LogTail is the end of the container's log (the previous run's when it
	// restarted).
	LogTail   string `json:"logTail,omitempty"`
	LogUnread string `json:"logUnread,omitempty"`
	// Probe is gpu-probe's report from inside the container, if it ran.
	Probe *ProbeResult `json:"probe,omitempty"`
}

// ProbeResult is what gpu-probe saw in an application container: which
// driver libraries loaded and what cuInit and nvmlInit returned.
type ProbeResult struct {
	Unread    string        `json:"unread,omitempty"`
	AllLoaded bool          `json:"allLoaded"`
	Libraries []ProbeLib    `json:"libraries,omitempty"`
	Calls     []ProbeCallRC `json:"calls,omitempty"`
}

// ProbeLib is one library's dlopen.
type ProbeLib struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Path  string `json:"path,omitempty"`
	Error string `json:"error,omitempty"`
}

// ProbeCallRC is one driver call's result.
type ProbeCallRC struct {
	Call string `json:"call"`
	Code int    `json:"code"`
	Name string `json:"name,omitempty"`
}

// AppPod is one pod of the application selector.
type AppPod struct {
	PodRef
	Phase      string           `json:"phase"`
	NodeName   string           `json:"nodeName,omitempty"`
	Containers []ContainerState `json:"containers,omitempty"`
}

// AppEvidence is the application's pods.
type AppEvidence struct {
	Selector string   `json:"selector"`
	Unread   string   `json:"unread,omitempty"`
	Pods     []AppPod `json:"pods,omitempty"`
}

// DaemonEvidence is one nvinject daemon's pod on the node, found through
// the API server.
type DaemonEvidence struct {
	App       string `json:"app"`
	Namespace string `json:"namespace"`
	Unread    string `json:"unread,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Phase     string `json:"phase,omitempty"`
	Ready     bool   `json:"ready"`
	Restarts  int32  `json:"restarts"`
	Waiting   string `json:"waiting,omitempty"`
	// WaitingMessage is kubelet's or the runtime's message for Waiting.
	WaitingMessage string `json:"waitingMessage,omitempty"`
	LastError      string `json:"lastError,omitempty"`
	MetricsURL     string `json:"metricsUrl,omitempty"`
	// MIGStrategy is the pod's --mig-strategy (MIG_STRATEGY), or the
	// daemon's default when its spec sets none; empty when its spec sets
	// it in a way the doctor cannot read (valueFrom).
	MIGStrategy string `json:"migStrategy,omitempty"`
	// CDISpecDir is where the pod's --cdi-spec-dir (where it writes the
	// node's CDI spec) is on the host, through its hostPath mounts;
	// HostDriverRoot its driver root as the host sees it
	// (--host-driver-root, else --driver-root), empty when its spec does
	// not set it.
	CDISpecDir     string `json:"cdiSpecDir,omitempty"`
	HostDriverRoot string `json:"hostDriverRoot,omitempty"`
	// Events are the pod's latest Warning events, one per reason (read
	// only while the pod does not run): FailedMount names a missing
	// hostPath, FailedCreatePodSandBox the runtime's error.
	Events []DaemonEvent `json:"events,omitempty"`
}

// DaemonEvent is one Warning event of a daemon's pod, bounded.
type DaemonEvent struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Known says whether the daemon's pod was looked up (through the API).
func (d DaemonEvidence) Known() bool { return d.App != "" && d.Unread == "" }

// Running says whether the daemon's pod runs and is ready.
func (d DaemonEvidence) Running() bool {
	return d.Unread == "" && d.Pod != "" && d.Phase == podRunning && d.Ready && d.Waiting == ""
}

// podRunning is corev1.PodRunning, the phase of a pod whose containers run.
const podRunning = "Running"

// Describe is the daemon's state in one line.
func (d DaemonEvidence) Describe() string {
	switch {
	case d.Unread != "":
		return d.Unread
	case d.Pod == "":
		return fmt.Sprintf("no %s pod (%s=%s in %s) on the node", d.App, contract.AppLabel, d.App, d.Namespace)
	}
	s := fmt.Sprintf("pod %s/%s %s ready=%t restarts=%d", d.Namespace, d.Pod, d.Phase, d.Ready, d.Restarts)
	if d.Waiting != "" {
		s += " waiting=" + d.Waiting
	}
	if d.WaitingMessage != "" {
		s += " " + strconv.Quote(d.WaitingMessage)
	}
	if d.LastError != "" {
		s += "; last run ended " + d.LastError
	}
	for _, e := range d.Events {
		s += fmt.Sprintf("; event %s: %s", e.Reason, e.Message)
	}
	return s
}
