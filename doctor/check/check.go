// Package check judges evidence: pure functions from the collected
// evidence to each layer's verdict, one table of checks per mode (the device
// plugin's, DRA's), and one pod's chain for explain. It does no I/O and
// imports, of the doctor, only evidence, so each check can be tested with
// evidence built by hand.
package check

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// Check is one layer's row of a mode's chain: the symptom it answers, the
// troubleshooting row, what it reads, and Eval, a pure function of
// the evidence.
type Check struct {
	Layer   Layer
	Symptom string
	// Row is the GPU troubleshooting table's row (symptom → what to
	// check); the table is the device plugin's, and a DRA check answers
	// the same row.
	Row string
	// Reads is the evidence Eval judges.
	Reads string
	Eval  func(evidence.Evidence) Verdict
}

// The troubleshooting rows of the layers whose check differs by mode.
const (
	rowRegistration = "the worker sees the GPU, the Node has no `nvidia.com/gpu` → device plugin registration, ListAndWatch, socket"
	rowHealth       = "capacity 1, allocatable 0 → the plugin reports the device unhealthy; check ListAndWatch"
	rowScheduling   = "pod stays Pending with `Insufficient nvidia.com/gpu` → the scheduler's ledger and the GPU pods already there"
	rowAllocate     = "pod bound, then `Allocate failed` → kubelet's device manager and the device plugin"
)

// The layers both modes judge alike.
var (
	driver = Check{Layer: LayerDriver, Symptom: "nvidia-smi fails on the worker",
		Row:   "`nvidia-smi` fails on the worker → the host driver, the container toolkit, the node's GPU injection",
		Reads: "nvidia-smi --query-gpu (--nvidia-smi), the selected-GPU ConfigMap", Eval: checkDriver}
	injection = Check{Layer: LayerInjection, Symptom: "every GPU pod refused: nvinject-nri not connected to containerd",
		Row:   "`CreateContainerError` mentions CDI/runtime → the NRI plugin nvinject-nri (fail-closed)",
		Reads: "nvinject-nri's pod on the node (state, waiting reason and message, last error, Warning events: FailedMount, BackOff, FailedCreatePodSandBox) and its " + contract.MetricNRIConnected + " metric, containers refused with containerd's `required plugin \"" + contract.NRIPluginName + "\" not present`", Eval: checkInjection}
	cdiRuntime = Check{Layer: LayerCDIRuntime, Symptom: "CreateContainerError mentioning CDI/runtime",
		Row:   "`CreateContainerError` mentions CDI/runtime → the CDI spec, containerd's handler, the RuntimeClass",
		Reads: "CDI spec files and whether pods' CDI names resolve (DRA: those of the allocated devices), every spec in the dirs containerd reads (in its order) and the devices more than one file defines: which file wins and whether it is nvinject's own spec, the driver version nvinject's spec was made from (" + contract.DriverVersionAnnotation + ") against the driver root's installed one (--driver-root), the RuntimeClass, containerd's config (handler, NRI, cdi_spec_dirs), nvinject-nri's own refusals (refusals metric, \"nvinject:\" container errors)", Eval: checkCDIRuntime}
	application = Check{Layer: LayerApplication, Symptom: "device present but CUDA init fails",
		Row:   "devices in the container, vLLM's CUDA init fails → driver/user-space compatibility, vLLM's arguments and logs",
		Reads: "the application pods' state and log tail (CUDA/NVML failure lines)", Eval: checkApplication}
)

// DevicePlugin is the chain of a node whose GPUs nvinject-device-plugin
// owns, in chain order.
var DevicePlugin = []Check{
	driver,
	{Layer: LayerRegistration, Symptom: "worker sees the GPU but the Node has no nvidia.com/gpu", Row: rowRegistration,
		Reads: "the node's mode (label " + contract.DRAModeLabel + ", daemons), Node capacity, the device-plugins dir (kubelet.sock, plugin socket), the plugin's pod (state, restarts, last error) and metrics (registrations, streams, devices), the live MIG devices (nvidia-smi -L) against the CDI spec's and Node capacity's (nvidia.com/mig-<profile> under mixed, nvidia.com/gpu under single), the plugin's MIG_STRATEGY",
		Eval:  checkRegistration},
	{Layer: LayerHealth, Symptom: "capacity 1 but allocatable 0", Row: rowHealth,
		Reads: "Node capacity vs allocatable, the plugin's device_healthy, health_events and gpu_held metrics, whether the plugin's pod runs",
		Eval:  checkHealth},
	{Layer: LayerScheduling, Symptom: "pod Pending with Insufficient nvidia.com/gpu", Row: rowScheduling,
		Reads: "GPU requests of pods bound to the node, unscheduled GPU pods and their FailedScheduling messages",
		Eval:  checkScheduling},
	{Layer: LayerAllocate, Symptom: "pod bound but Allocate failed", Row: rowAllocate,
		Reads: "pod status and UnexpectedAdmissionError events with Allocate failed, the plugin's refused Allocate counter, kubelet's PodResources (which pods hold each GPU and MIG device) against the CDI spec's " + contract.SharedReplicasAnnotation + ", the MPS control socket under each " + contract.MPSPipeDirAnnotation,
		Eval:  checkAllocate},
	injection,
	cdiRuntime,
	application,
}

// DRA is the chain of a node whose GPUs nvinject-dra owns, layer for layer
// as DevicePlugin: registration, health, scheduling and allocate read DRA's
// objects (evidence.DRAEvidence, which its checks need collected).
var DRA = []Check{
	driver,
	{Layer: LayerRegistration, Symptom: "worker sees the GPU but no ResourceSlice offers it", Row: rowRegistration,
		Reads: "the node's mode and its other owner, nvinject-dra's pod and metrics (registered), the driver's ResourceSlices for the node and their devices, DeviceClass " + contract.DRADriver + " and its extendedResourceName, Node allocatable (0 on a DRA node), the live MIG devices (nvidia-smi -L) against the CDI spec's and the ResourceSlices' (" + contract.DRAAttrType + "=" + contract.DRATypeMIG + "), nvinject-dra's MIG_STRATEGY",
		Eval:  checkDRARegistration},
	{Layer: LayerHealth, Symptom: "the GPU is published but tainted, or a pod's device Unhealthy", Row: rowHealth,
		Reads: "ResourceSlice device taints (" + contract.DRATaintKey + ", " + contract.DRAHeldTaintKey + "), nvinject-dra's device_healthy, health_events and health_streams metrics, pods' status.containerStatuses[].allocatedResourcesStatus (KEP-4680)",
		Eval:  checkDRAHealth},
	{Layer: LayerScheduling, Symptom: "pod Pending: no device can be allocated", Row: rowScheduling,
		Reads: "the claims holding the node's devices, free and tainted devices, unscheduled pods (nvidia.com/gpu or resourceClaims) and their FailedScheduling messages",
		Eval:  checkDRAScheduling},
	{Layer: LayerAllocate, Symptom: "pod bound but its claim is not prepared", Row: rowAllocate,
		Reads: "each claim's allocation (status.allocation.devices.results: driver, pool, device; reservedFor; the pod's extendedResourceClaimStatus or resourceClaimStatuses), FailedPrepareDynamicResources events, nvinject-dra's prepare metrics",
		Eval:  checkDRAAllocate},
	injection,
	cdiRuntime,
	application,
}

// Table is the chain to judge e by: DRA's when e was collected on a
// DRA-mode node (its DRA evidence with it), else the device plugin's.
func Table(e evidence.Evidence) []Check {
	if e.Mode.Mode == contract.DRAModeDRA && e.DRA != nil {
		return DRA
	}
	return DevicePlugin
}

// Evaluate runs every check of e's table on e.
func Evaluate(e evidence.Evidence) []Verdict {
	table := Table(e)
	out := make([]Verdict, 0, len(table))
	for _, c := range table {
		v := c.Eval(e)
		v.Layer, v.Symptom = c.Layer, c.Symptom
		if v.Status == OK {
			v.Fix = ""
		}
		out = append(out, v)
	}
	return out
}

// finding accumulates one layer's facts and problems.
type finding struct {
	facts    []string
	problems []string
	fixes    []string
	missing  []string
}

func (f *finding) fact(format string, a ...any) { f.facts = append(f.facts, fmt.Sprintf(format, a...)) }

func (f *finding) problem(fix, format string, a ...any) {
	f.problems = append(f.problems, fmt.Sprintf(format, a...))
	if fix != "" {
		f.fix(fix)
	}
}

// fix adds a fix that several problems share.
func (f *finding) fix(fix string) {
	if !slices.Contains(f.fixes, fix) {
		f.fixes = append(f.fixes, fix)
	}
}

func (f *finding) unread(what, why string) {
	if why != "" {
		f.missing = append(f.missing, "could not read "+what+": "+why)
	}
}

// verdict is broken with any problem, else unknown with anything unread,
// else ok.
func (f *finding) verdict(unknownFix string) Verdict {
	ev := append(append(slices.Clone(f.problems), f.missing...), f.facts...)
	switch {
	case len(f.problems) > 0:
		return Verdict{Status: Broken, Evidence: ev, Fix: strings.Join(f.fixes, "; ")}
	case len(f.missing) > 0:
		return Verdict{Status: Unknown, Evidence: ev, Fix: unknownFix}
	}
	return Verdict{Status: OK, Evidence: ev}
}
