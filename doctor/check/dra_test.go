package check

import (
	"testing"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

const (
	draNode   = "nvinject-sim-worker"
	claimName = "vllm-demo-1-gpu-x7k2p"
	// unhealthyTaint is nvinject-dra's taint on a device after an Xid.
	unhealthyTaint = contract.DRATaintKey + "=xid:NoSchedule"
)

// healthyDRA is the GPU chain on a DRA-mode node: nvinject-dra
// registered, its slice offering the GPU, DeviceClass serving
// nvidia.com/gpu, and the scheduler's claim for the vLLM pod's
// nvidia.com/gpu: 1 allocated, prepared and healthy.
func healthyDRA() evidence.Evidence {
	e := healthy()
	e.Node = draNode
	e.Mode = evidence.ModeEvidence{Mode: contract.DRAModeDRA, Source: "Node label " + contract.DRAModeLabel + "=" + contract.DRAModeDRA}
	e.NodeStatus = evidence.NodeEvidence{ModeLabel: contract.DRAModeDRA}
	e.KubeletDir.PluginSockets = nil
	e.Plugin = evidence.PluginEvidence{Unread: "no metrics URL (pass --device-plugin-metrics, or let the doctor find the pod through the API server)"}
	e.PluginPod = evidence.DaemonEvidence{App: contract.DevicePluginApp, Namespace: contract.Namespace}
	e.DRAPod = running(contract.DRAApp)
	e.NRIPod = running(contract.NRIApp)
	device := evidence.SliceDevice{Pool: draNode, Name: "gpu-0", UUID: uuid, Memory: "80Gi"}
	vllm := pod("default", "vllm-demo-1")
	e.DRA = &evidence.DRAEvidence{
		Metrics: evidence.DRAMetricsEvidence{URL: "http://10.0.0.5:9483/metrics", Registered: f64(1), Prepared: f64(1), PrepareErrors: f64(0), HealthStreams: f64(1),
			Devices: []evidence.DeviceHealth{{UUID: uuid, Healthy: true}}},
		Slices: evidence.SliceEvidence{Slices: []string{draNode + "-gpu.nvinject.io-abcde"}, Devices: []evidence.SliceDevice{device}},
		Class:  evidence.DeviceClassEvidence{Name: contract.DRADriver, Exists: true, ExtendedResourceName: contract.ResourceName},
		Claims: evidence.ClaimsEvidence{
			Claims: []evidence.Claim{{Namespace: "default", Name: claimName, Extended: true, Allocated: true,
				Devices:     []evidence.ClaimDevice{{Request: "container-0-request-0", Driver: contract.DRADriver, Pool: draNode, Device: "gpu-0"}},
				ReservedFor: []string{"default/vllm-demo-1"}, Pods: []evidence.PodRef{vllm}}},
			Health: []evidence.ResourceHealth{{PodRef: evidence.PodRef{Namespace: "default", Name: "vllm-demo-1", Container: "vllm"},
				Resource: "claim:container-0-request-0", ID: "nvidia.com/gpu=" + uuid, Health: "Healthy"}},
		},
	}
	return e
}

// pendingPod is a GPU pod the scheduler cannot place, with its message.
func pendingPod(msg string) func(*evidence.Evidence) {
	return func(e *evidence.Evidence) {
		e.Ledger.Pending = []evidence.PodMessage{{PodRef: pod("default", "second"), Reason: "FailedScheduling", Message: msg}}
	}
}

// noClaim frees the node's device: the claim and its pod's health are gone.
func noClaim(e *evidence.Evidence) { e.DRA.Claims = evidence.ClaimsEvidence{} }

const cannotAllocate = "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable"

// draCases are the DRA table's layers, each ok, broken and (where an input
// can be missing) unknown.
var draCases = []verdictCase{
	{"driver ok", LayerDriver, nil, OK, uuid, ""},
	{"driver fails", LayerDriver, func(e *evidence.Evidence) {
		e.SMI = evidence.SMIEvidence{Path: "nvidia-smi", Failed: "exit status 9", Output: "NVIDIA-SMI has failed"}
	}, Broken, "NVIDIA-SMI has failed", "host driver"},

	{"registration ok", LayerRegistration, nil, OK, "DeviceClass gpu.nvinject.io serves extended resource nvidia.com/gpu (KEP-5004)", ""},
	{"registration names the node's mode", LayerRegistration, nil, OK, "mode dra (Node label nvinject.io/gpu-mode=dra)", ""},
	{"nvinject-dra crash-loops", LayerRegistration, func(e *evidence.Evidence) {
		e.DRAPod = crashing(contract.DRAApp, "register with kubelet: plugins_registry not found")
		e.DRA.Metrics = evidence.DRAMetricsEvidence{Unread: "no metrics URL"}
	}, Broken, "nvinject-dra is not running on " + draNode + ": pod nvidia-device-plugin/nvinject-dra-x1 Running ready=false restarts=4 waiting=CrashLoopBackOff; last run ended Error (exit code 1): register with kubelet: plugins_registry not found",
		"correct what the daemon's last error says"},
	{"no nvinject-dra pod", LayerRegistration, func(e *evidence.Evidence) {
		e.DRAPod = evidence.DaemonEvidence{App: contract.DRAApp, Namespace: contract.Namespace}
	}, Broken, "nvinject-dra is not running on " + draNode + ": no nvinject-dra pod", "does not select the node"},
	{"driver not registered with kubelet", LayerRegistration, func(e *evidence.Evidence) {
		e.DRA.Metrics.Registered = f64(0)
		e.DRA.Slices = evidence.SliceEvidence{}
	}, Broken, "kubelet has not accepted gpu.nvinject.io's registration (nvinject_dra_registered=0)", "plugins_registry"},
	{"no ResourceSlice", LayerRegistration, func(e *evidence.Evidence) { e.DRA.Slices = evidence.SliceEvidence{} },
		Broken, "no ResourceSlice of driver gpu.nvinject.io for node " + draNode, "RBAC of ServiceAccount nvinject-dra"},
	{"a ResourceSlice without devices", LayerRegistration, func(e *evidence.Evidence) { e.DRA.Slices.Devices = nil },
		Broken, "the ResourceSlices of gpu.nvinject.io on " + draNode + " list no device", "MIG must be off"},
	{"no DeviceClass", LayerRegistration, func(e *evidence.Evidence) { e.DRA.Class = evidence.DeviceClassEvidence{Name: contract.DRADriver} },
		Broken, "DeviceClass gpu.nvinject.io does not exist", "kubectl apply -k deploy/overlays/dra-node"},
	{"DeviceClass without extendedResourceName", LayerRegistration, func(e *evidence.Evidence) { e.DRA.Class.ExtendedResourceName = "" },
		Broken, `extendedResourceName "", want "nvidia.com/gpu": pods asking for nvidia.com/gpu: 1 stay Pending`, "extendedResourceName nvidia.com/gpu"},
	{"two owners", LayerRegistration, func(e *evidence.Evidence) {
		e.PluginPod = running(contract.DevicePluginApp)
		e.NodeStatus = evidence.NodeEvidence{Published: true, Capacity: 1, Allocatable: 1, ModeLabel: contract.DRAModeDRA}
	}, Broken, "single-gpu-device-plugin also runs on " + draNode + " (pod nvidia-device-plugin/single-gpu-device-plugin-x1 Running ready=true restarts=0): two owners of nvidia.com/gpu\n" +
		"Node " + draNode + " still has allocatable nvidia.com/gpu=1 from a device plugin", "label it nvinject.io/gpu-mode=dra or =device-plugin"},
	{"registration without the cluster", LayerRegistration, func(e *evidence.Evidence) {
		e.DRAPod = evidence.DaemonEvidence{App: contract.DRAApp, Namespace: contract.Namespace, Unread: unread}
		e.DRA.Metrics = evidence.DRAMetricsEvidence{Unread: "no metrics URL"}
		e.DRA.Slices = evidence.SliceEvidence{Unread: unread}
		e.DRA.Class = evidence.DeviceClassEvidence{Name: contract.DRADriver, Unread: unread}
	}, Unknown, "could not read ResourceSlices: " + unread, "--dra-metrics"},

	{"health ok", LayerHealth, nil, OK, "default/vllm-demo-1[vllm]: claim:container-0-request-0 nvidia.com/gpu=" + uuid + " Healthy", ""},
	{"Xid: the device is tainted", LayerHealth, func(e *evidence.Evidence) {
		e.DRA.Slices.Devices[0].Taints = []string{unhealthyTaint}
		e.DRA.Metrics.Devices[0].Healthy = false
		e.DRA.Metrics.HealthEvents = []string{"xid 79"}
	}, Broken, "device " + draNode + "/gpu-0 (" + uuid + ") is tainted " + unhealthyTaint + ": new claims avoid it (plugin counted health events: xid 79)", "removes taint gpu.nvinject.io/unhealthy"},
	{"Unhealthy before the slice is tainted", LayerHealth, func(e *evidence.Evidence) { e.DRA.Metrics.Devices[0].Healthy = false },
		Broken, "nvinject-dra reports " + uuid + " Unhealthy but its ResourceSlice device has no taint yet", "--health-quiet-period"},
	{"Unhealthy, slices unread", LayerHealth, func(e *evidence.Evidence) {
		e.DRA.Metrics.Devices[0].Healthy = false
		e.DRA.Slices = evidence.SliceEvidence{Unread: unread}
	}, Broken, "nvinject-dra reports " + uuid + " Unhealthy", "SIGHUP"},
	{"the pod's device Unhealthy", LayerHealth, func(e *evidence.Evidence) { e.DRA.Claims.Health[0].Health = "Unhealthy" },
		Broken, "default/vllm-demo-1[vllm]: claim:container-0-request-0 nvidia.com/gpu=" + uuid + " is Unhealthy (status.allocatedResourcesStatus)", "delete the affected pod"},
	{"the pod's device health Unknown, no health stream", LayerHealth, func(e *evidence.Evidence) {
		e.DRA.Claims.Health[0].Health = "Unknown"
		e.DRA.Metrics.HealthStreams = f64(0)
	}, Broken, "kubelet has no health stream (NodeWatchResources) open to nvinject-dra", "nvinject_dra_health_streams is 1"},
	{"nvinject-dra cannot read PodResources", LayerHealth, func(e *evidence.Evidence) {
		e.DRA.Slices.Devices[0].Taints = []string{contract.DRAHeldTaintKey + "=" + contract.DRAHeldTaintUnknown + ":NoSchedule"}
	}, Broken, "is tainted gpu.nvinject.io/device-plugin-pod=unknown:NoSchedule: nvinject-dra cannot read kubelet's PodResources", "mount kubelet's pod-resources dir"},
	{"a device-plugin pod still holds the GPU", LayerHealth, func(e *evidence.Evidence) {
		e.DRA.Slices.Devices[0].Taints = []string{contract.DRAHeldTaintKey + "=" + contract.DRAHeldTaintValue + ":NoSchedule"}
	}, OK, "is tainted gpu.nvinject.io/device-plugin-pod=running:NoSchedule: a pod given it by the device plugin before the node moved to DRA still runs", ""},
	{"health without slices and metrics", LayerHealth, func(e *evidence.Evidence) {
		e.DRA.Slices = evidence.SliceEvidence{Unread: unread}
		e.DRA.Metrics = evidence.DRAMetricsEvidence{Unread: "no metrics URL"}
	}, Unknown, "could not read ResourceSlices: " + unread, "--dra-metrics"},

	{"scheduling ok", LayerScheduling, nil, OK, "1 of 1 published device(s) allocated, 0 tainted Unhealthy, 0 held by device-plugin pods, 0 with holders unknown, 0 free; claims: default/" + claimName + " (" + draNode + "/gpu-0, reserved for default/vllm-demo-1)", ""},
	{"GPU taken", LayerScheduling, pendingPod(cannotAllocate),
		Broken, "pod default/second Pending: " + cannotAllocate, "every GPU on the node is allocated: free one (delete or scale down the pods holding default/" + claimName},
	{"the free GPU is tainted", LayerScheduling, func(e *evidence.Evidence) {
		noClaim(e)
		e.DRA.Slices.Devices[0].Taints = []string{unhealthyTaint}
		pendingPod(cannotAllocate)(e)
	}, Broken, "0 of 1 published device(s) allocated, 1 tainted Unhealthy", "the free GPU is tainted Unhealthy: fix the health layer first"},
	{"the free GPU is a device-plugin pod's", LayerScheduling, func(e *evidence.Evidence) {
		noClaim(e)
		e.DRA.Slices.Devices[0].Taints = []string{contract.DRAHeldTaintKey + "=" + contract.DRAHeldTaintValue + ":NoSchedule"}
		pendingPod(cannotAllocate)(e)
	}, Broken, "1 held by device-plugin pods, 0 with holders unknown, 0 free", "still holds it (taint gpu.nvinject.io/device-plugin-pod)"},
	{"the free GPU's holders unknown", LayerScheduling, func(e *evidence.Evidence) {
		noClaim(e)
		e.DRA.Slices.Devices[0].Taints = []string{contract.DRAHeldTaintKey + "=" + contract.DRAHeldTaintUnknown + ":NoSchedule"}
		pendingPod(cannotAllocate)(e)
	}, Broken, "0 held by device-plugin pods, 1 with holders unknown, 0 free", "--pod-resources-socket"},
	{"nothing published", LayerScheduling, func(e *evidence.Evidence) {
		e.DRA.Slices.Devices = nil
		pendingPod("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")(e)
	}, Broken, "Insufficient nvidia.com/gpu", "the node publishes no device: fix the registration layer first"},
	{"no DeviceClass for the claim", LayerScheduling, pendingPod(`0/1 nodes are available: 1 device class gpu.nvinject.io does not exist`),
		Broken, "device class gpu.nvinject.io does not exist", "kubectl apply -k deploy/overlays/dra-node"},
	{"a device is free but no claim fits it", LayerScheduling, func(e *evidence.Evidence) {
		noClaim(e)
		pendingPod(cannotAllocate)(e)
	}, Broken, "0 of 1 published device(s) allocated, 0 tainted Unhealthy, 0 held by device-plugin pods, 0 with holders unknown, 1 free", "the claim's selectors (CEL) or the pod's node constraints match none of " + draNode + "'s devices"},
	{"pending for another reason", LayerScheduling, pendingPod("0/1 nodes are available: 1 node(s) had untolerated taint"), OK, "1 of 1 published device(s) allocated", ""},
	{"scheduling without claims", LayerScheduling, func(e *evidence.Evidence) { e.DRA.Claims = evidence.ClaimsEvidence{Unread: unread} },
		Unknown, "could not read ResourceClaims: " + unread, "--kubeconfig, --node-name"},

	{"allocate ok", LayerAllocate, nil, OK, "claim default/" + claimName + " (the scheduler's claim for nvidia.com/gpu (KEP-5004)) allocated by the scheduler: request container-0-request-0 → gpu.nvinject.io/" + draNode + "/gpu-0 " + uuid + ", reserved for default/vllm-demo-1", ""},
	{"the pod's own ResourceClaim", LayerAllocate, func(e *evidence.Evidence) { e.DRA.Claims.Claims[0].Extended = false },
		OK, "claim default/" + claimName + " (ResourceClaim) allocated by the scheduler", ""},
	{"stale: the claim holds a device no slice lists", LayerAllocate, func(e *evidence.Evidence) { e.DRA.Slices.Devices = nil },
		Broken, "claim default/" + claimName + " holds gpu.nvinject.io/" + draNode + "/gpu-0, which no ResourceSlice of " + draNode + " lists", "the claim holds a device the node's ResourceSlice no longer has"},
	{"claim not allocated", LayerAllocate, func(e *evidence.Evidence) {
		e.DRA.Claims.Claims[0].Allocated, e.DRA.Claims.Claims[0].Devices = false, nil
	}, Broken, "claim default/" + claimName + " (the scheduler's claim for nvidia.com/gpu (KEP-5004)) used by [default/vllm-demo-1] is not allocated", "kubectl describe resourceclaim -n default " + claimName},
	{"NodePrepareResources failed", LayerAllocate, func(e *evidence.Evidence) {
		e.Allocate.PrepareFailures = []evidence.PodMessage{{PodRef: pod("default", "vllm-demo-1"), Reason: "FailedPrepareDynamicResources",
			Message: "Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim default/" + claimName + ": GPU gpu-0 is not in the CDI spec"}}
	}, Broken, "pod default/vllm-demo-1: Failed to prepare dynamic resources: NodePrepareResources failed for ResourceClaim default/" + claimName, "kubectl -n " + contract.Namespace + " logs ds/nvinject-dra"},
	{"kubelet lost the resource's device-plugin endpoint", LayerAllocate, func(e *evidence.Evidence) {
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: evidence.PodRef{Namespace: "default", Name: "vllm-demo-1", Container: "vllm"}, Reason: "CreateContainerConfigError",
			Message: "endpoint not found in cache for a registered resource: nvidia.com/gpu"}}
	}, Broken, "default/vllm-demo-1[vllm] CreateContainerConfigError: endpoint not found in cache for a registered resource: nvidia.com/gpu", "--hold-resource-endpoint"},
	{"allocate without claims", LayerAllocate, func(e *evidence.Evidence) { e.DRA.Claims = evidence.ClaimsEvidence{Unread: unread} },
		Unknown, "could not read ResourceClaims: " + unread, "--kubeconfig, --node-name"},

	{"injection ok", LayerInjection, nil, OK, "nvinject-nri is connected to containerd's NRI", ""},
	{"nvinject-nri disconnected, fail-closed", LayerInjection, func(e *evidence.Evidence) { e.NRI.Connected = f64(0) },
		Broken, "nvinject-nri is not connected to containerd (nvinject_nri_connected 0), so containerd refuses every GPU pod on " + draNode + " (fail-closed)", "dial error"},
	{"nvinject-nri cannot mount the NRI socket dir", LayerInjection, func(e *evidence.Evidence) { e.NRIPod = nriPending("nri-socket") },
		Broken, "nvinject-nri is not running on " + draNode, "volume nri-socket"},

	{"cdi-runtime ok", LayerCDIRuntime, nil, OK, "1 of the 1 CDI names pods need resolve", ""},
	{"stale spec: the claimed GPU's CDI name resolves to nothing", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.CDI.Unresolved = []string{"nvidia.com/gpu=" + uuid}
	}, Broken, "CDI device nvidia.com/gpu=" + uuid + " resolves to no device", "the CDI spec for that GPU is missing or stale"},
	{"nvinject-nri refusal", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: evidence.PodRef{Namespace: "default", Name: "p", Container: "c"}, Reason: "CreateContainerError",
			Message: `nvinject: container c of pod default/p: GPU ` + uuid + ` is held by pod default/vllm-demo-1`}}
	}, Broken, "nvinject-nri refused default/p[c]", "nvinject-doctor explain --pod-namespace NS POD"},

	{"application ok", LayerApplication, nil, OK, "default/vllm-demo-1[vllm] running and ready", ""},
	{"the claim's pod refused fail-closed", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0] = evidence.ContainerState{Name: "vllm", State: "waiting", Reason: "CreateContainerError", Message: refusedMsg}
	}, Broken, "refused fail-closed because nvinject-nri is not connected", "fix the injection layer (nvinject-nri) first"},
}

func TestDRATable(t *testing.T) { runCases(t, healthyDRA, draCases) }

// TestHealthyDRAChain: the working DRA chain is ok on every layer.
func TestHealthyDRAChain(t *testing.T) {
	r := Report{Verdicts: Evaluate(healthyDRA())}
	for _, v := range r.Verdicts {
		if v.Status != OK {
			t.Errorf("%s = %s: %v", v.Layer, v.Status, v.Evidence)
		}
	}
	if len(r.Verdicts) != len(DRA) || len(r.Broken()) != 0 {
		t.Errorf("verdicts %d broken %v", len(r.Verdicts), r.Broken())
	}
	if v, _ := r.Verdict(LayerRegistration); v.Symptom != DRA[1].Symptom {
		t.Errorf("registration symptom %q, want DRA's %q", v.Symptom, DRA[1].Symptom)
	}
}
