package check

import (
	"strconv"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

const uuid = "GPU-4f1c7a52-9b7e-4c1d-8a3e-000000000001"

// refusedMsg is containerd's default validator refusing a GPU container
// while nvinject-nri is not connected (kubelet's CreateContainerError).
const refusedMsg = `failed to create containerd container: validator "00-default-validator" rejected container adjustment, reason: validation error: required plugin "nvinject" not present`

func f64(v float64) *float64 { return &v }

// ownSpec is the device plugin's CDI spec.
const ownSpec = "/var/run/cdi/nvidia.com-gpu.yaml"

// healthy is the working GPU chain: one A100 selected, registered,
// healthy, held by the vLLM pod that runs.
func healthy() evidence.Evidence {
	return evidence.Evidence{
		Node: "k8s-ai-infra-worker", Resource: "nvidia.com/gpu", RuntimeClass: "nvidia",
		SMI:        evidence.SMIEvidence{Path: "nvidia-smi", GPUs: []evidence.GPU{{Index: "0", UUID: uuid, Name: "NVIDIA A100-SXM4-80GB", MIGMode: "Disabled"}}},
		KubeletDir: evidence.KubeletDirEvidence{Dir: "/var/lib/kubelet/device-plugins", KubeletSocket: true, PluginSockets: []string{"nvinject-gpu.sock"}},
		Plugin: evidence.PluginEvidence{URL: "http://127.0.0.1:9481/metrics", Registrations: f64(1), Streams: f64(1),
			Devices: []evidence.DeviceHealth{{UUID: uuid, Healthy: true}}, AllocateErrors: f64(0)},
		NodeStatus: evidence.NodeEvidence{Published: true, Capacity: 1, Allocatable: 1},
		Selected:   evidence.SelectedEvidence{Source: "ConfigMap", UUIDs: []string{uuid}},
		Ledger:     evidence.LedgerEvidence{Holders: []evidence.GPUHolder{{PodRef: pod("default", "vllm-demo-1"), Phase: "Running", GPUs: 1}}},
		CDI: evidence.CDIEvidence{Dirs: []string{"/var/run/cdi"}, Files: []string{"/var/run/cdi/nvidia.com-gpu.yaml"},
			Devices: []string{"nvidia.com/gpu=" + uuid, "nvidia.com/gpu=all"}, Wanted: []string{"nvidia.com/gpu=" + uuid},
			RuntimeDirs: []string{"/etc/cdi", "/var/run/cdi"}, OwnSpec: ownSpec,
			Specs: []evidence.SpecFile{{Path: ownSpec, Priority: 1, Kind: "nvidia.com/gpu", Devices: 2, DriverVersion: "580.95.05"}}},
		DriverRoot: evidence.DriverRootEvidence{Root: "/", Source: "the default", Version: "580.95.05", File: "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05"},
		RuntimeCls: evidence.RuntimeClassEvidence{Exists: true, Handler: "nvidia"},
		Containerd: evidence.ContainerdEvidence{Path: "/etc/containerd/config.toml", Handlers: []string{"nvidia", "runc"}, CDISpecDirs: []string{"/etc/cdi", "/var/run/cdi"}},
		NRI:        evidence.NRIEvidence{URL: "http://127.0.0.1:9482/metrics", Connected: f64(1)},
		App: evidence.AppEvidence{Selector: "app=vllm-demo", Pods: []evidence.AppPod{{PodRef: pod("default", "vllm-demo-1"), Phase: "Running",
			Containers: []evidence.ContainerState{{Name: "vllm", State: "running", Ready: true}}}}},
	}
}

// verdictCase is one state of a layer: the evidence changed from a mode's
// healthy chain, and the verdict the layer must give.
type verdictCase struct {
	name   string
	layer  Layer
	mutate func(*evidence.Evidence)
	want   Status
	// evidence and fix must contain these.
	evidence, fix string
}

// unread is why the API server could not be read, in the cases without it.
const unread = "no kubeconfig"

// devicePluginCases are the DevicePlugin table's layers, each ok, broken
// and (where an input can be missing) unknown.
var devicePluginCases = []verdictCase{
	{"driver ok", LayerDriver, nil, OK, uuid, ""},
	{"driver fails", LayerDriver, func(e *evidence.Evidence) {
		e.SMI = evidence.SMIEvidence{Path: "nvidia-smi", Failed: "exit status 9", Output: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."}
	}, Broken, "couldn't communicate", "host driver"},
	{"driver lists no GPU", LayerDriver, func(e *evidence.Evidence) { e.SMI.GPUs = nil; e.SMI.Output = "No devices were found" }, Broken, "No devices", "nvkind"},
	{"selected GPU not on worker", LayerDriver, func(e *evidence.Evidence) { e.Selected.UUIDs = []string{"GPU-other"} }, Broken, "GPU-other", "selected-gpu-uuid"},
	{"MIG mode pending a reset", LayerDriver, func(e *evidence.Evidence) { e.SMI.GPUs[0].MIGPending = "Enabled" }, Broken, "MIG mode Enabled pending a reset (now Disabled)", "nvidia-smi -i 0 -r"},
	{"MIG mode not supported", LayerDriver, func(e *evidence.Evidence) { e.SMI.GPUs[0].MIGPending = "[N/A]" }, OK, uuid, ""},
	{"nvidia-smi not runnable", LayerDriver, func(e *evidence.Evidence) { e.SMI = evidence.SMIEvidence{Path: "nvidia-smi", Unread: "not found"} }, Unknown, "not found", "--nvidia-smi"},

	{"registration ok", LayerRegistration, nil, OK, "capacity nvidia.com/gpu=1", ""},
	{"plugin not registered", LayerRegistration, func(e *evidence.Evidence) {
		e.NodeStatus = evidence.NodeEvidence{}
		e.KubeletDir.PluginSockets = nil
		e.Plugin = evidence.PluginEvidence{URL: e.Plugin.URL, Unread: "connection refused"}
	}, Broken, "no device plugin socket", "single-gpu-device-plugin"},
	{"no ListAndWatch", LayerRegistration, func(e *evidence.Evidence) { e.NodeStatus = evidence.NodeEvidence{}; e.Plugin.Streams = f64(0) }, Broken, "ListAndWatch", "re"},
	{"plugin gone, stale capacity", LayerRegistration, func(e *evidence.Evidence) {
		e.NodeStatus.Allocatable = 0
		e.KubeletDir.PluginSockets = nil
	}, Broken, "no device plugin socket", "not serving"},
	{"plugin publishes nothing", LayerRegistration, func(e *evidence.Evidence) { e.NodeStatus = evidence.NodeEvidence{}; e.Plugin.Devices = nil }, Broken, "publishes no device", "selected-gpu-uuid"},
	{"kubelet down", LayerRegistration, func(e *evidence.Evidence) { e.NodeStatus = evidence.NodeEvidence{}; e.KubeletDir.KubeletSocket = false }, Broken, "kubelet.sock", "start kubelet"},
	{"plugin side broken without API", LayerRegistration, func(e *evidence.Evidence) {
		e.NodeStatus = evidence.NodeEvidence{Unread: unread}
		e.Plugin.Registrations = f64(0)
	}, Broken, "never registered", "logs"},
	{"plugin not ready: PodResources unreadable", LayerRegistration, func(e *evidence.Evidence) {
		e.PluginPod = evidence.DaemonEvidence{App: "single-gpu-device-plugin", Namespace: "nvidia-device-plugin", Pod: "dp-1", Phase: "Running", Ready: false}
		e.Plugin.Held = []evidence.HeldGPU{{UUID: uuid, Holder: "unknown"}}
	}, Broken, "is not ready: it cannot read kubelet's PodResources", "--pod-resources-socket"},
	{"plugin side fine without API", LayerRegistration, func(e *evidence.Evidence) { e.NodeStatus = evidence.NodeEvidence{Unread: unread} }, Unknown, unread, "--kubeconfig"},

	{"health ok", LayerHealth, nil, OK, "allocatable=1", ""},
	{"device unhealthy", LayerHealth, func(e *evidence.Evidence) {
		e.NodeStatus.Allocatable = 0
		e.Plugin.Devices[0] = evidence.DeviceHealth{UUID: uuid, Healthy: false}
		e.Plugin.HealthEvents = []string{"xid 79"}
	}, Broken, "health events: xid 79", "/debug/sim/recover"},
	{"allocatable 0 seen by kubelet only", LayerHealth, func(e *evidence.Evidence) { e.NodeStatus.Allocatable = 0 }, Broken, "allocatable=0", "health-quiet-period"},
	{"unhealthy from metrics without API", LayerHealth, func(e *evidence.Evidence) {
		e.NodeStatus = evidence.NodeEvidence{Unread: unread}
		e.Plugin.Devices[0].Healthy = false
	}, Broken, uuid, "SIGHUP"},
	{"healthy from metrics without API", LayerHealth, func(e *evidence.Evidence) { e.NodeStatus = evidence.NodeEvidence{Unread: unread} }, OK, "healthy=true", ""},
	{"nothing readable", LayerHealth, func(e *evidence.Evidence) {
		e.NodeStatus = evidence.NodeEvidence{Unread: unread}
		e.Plugin = evidence.PluginEvidence{Unread: "refused"}
	}, Unknown, unread, "--device-plugin-metrics"},
	{"no capacity", LayerHealth, func(e *evidence.Evidence) { e.NodeStatus = evidence.NodeEvidence{} }, Unknown, "registration layer", ""},
	{"GPU held by a DRA pod, not an Xid", LayerHealth, func(e *evidence.Evidence) {
		e.NodeStatus.Allocatable = 0
		e.Plugin.Held = []evidence.HeldGPU{{UUID: uuid, Holder: "dra-claim", Pod: "default/vllm-dra", Claim: "default/vllm-dra-gpu-x7"}}
	}, Broken, "device " + uuid + " is published Unhealthy because pod default/vllm-dra holds it through DRA claim default/vllm-dra-gpu-x7, not for its health", "delete or drain that pod"},
	{"plugin cannot read PodResources", LayerHealth, func(e *evidence.Evidence) {
		e.NodeStatus.Allocatable = 0
		e.PluginPod = evidence.DaemonEvidence{App: "single-gpu-device-plugin", Namespace: "nvidia-device-plugin", Pod: "dp-1", Phase: "Running", Ready: false}
		e.Plugin.Held = []evidence.HeldGPU{{UUID: uuid, Holder: "unknown"}}
	}, Broken, "cannot read kubelet's PodResources", "mount kubelet's pod-resources dir"},

	{"scheduling ok", LayerScheduling, nil, OK, "vllm-demo-1", ""},
	{"GPU taken", LayerScheduling, func(e *evidence.Evidence) {
		e.Ledger.Pending = []evidence.PodMessage{{PodRef: pod("default", "second"), Message: "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}}
	}, Broken, "Insufficient nvidia.com/gpu", "free one (delete or scale down default/vllm-demo-1"},
	{"insufficient with zero allocatable", LayerScheduling, func(e *evidence.Evidence) {
		e.NodeStatus.Allocatable = 0
		e.Ledger = evidence.LedgerEvidence{Pending: []evidence.PodMessage{{PodRef: pod("default", "p"), Message: "1 Insufficient nvidia.com/gpu"}}}
	}, Broken, "Insufficient", "registration or health"},
	{"GPU held by a DRA pod", LayerScheduling, func(e *evidence.Evidence) {
		e.NodeStatus.Allocatable = 0
		e.Ledger = evidence.LedgerEvidence{Pending: []evidence.PodMessage{{PodRef: pod("default", "p"), Message: "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}}}
		e.Plugin.Held = []evidence.HeldGPU{{UUID: uuid, Holder: "dra-claim", Pod: "default/vllm-dra", Claim: "default/vllm-dra-gpu-x7"}}
	}, Broken, "held through DRA, so not allocatable: pod default/vllm-dra (claim default/vllm-dra-gpu-x7", "the free GPU is held through DRA by pod default/vllm-dra"},
	{"pending for another reason", LayerScheduling, func(e *evidence.Evidence) {
		e.Ledger.Pending = []evidence.PodMessage{{PodRef: pod("default", "p"), Message: "0/1 nodes are available: 1 node(s) had untolerated taint"}}
	}, OK, "1 nvidia.com/gpu requested", ""},
	{"scheduling without API", LayerScheduling, func(e *evidence.Evidence) { e.Ledger = evidence.LedgerEvidence{Unread: unread} }, Unknown, unread, "--kubeconfig"},

	{"allocate ok", LayerAllocate, nil, OK, "no pod", ""},
	{"allocate failed", LayerAllocate, func(e *evidence.Evidence) {
		e.Allocate.Failures = []evidence.PodMessage{{PodRef: pod("default", "p"), Reason: "UnexpectedAdmissionError", Message: "Pod was rejected: Allocate failed due to device plugin Allocate rpc failed, which is unexpected"}}
	}, Broken, "Allocate failed", "re-registers"},
	{"admission race after a kubelet restart", LayerAllocate, func(e *evidence.Evidence) {
		e.Allocate.Failures = []evidence.PodMessage{{PodRef: pod("default", "p"), Reason: "UnexpectedAdmissionError", Message: "Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected"}}
	}, Broken, "device-manager race after a restart", "delete the failed pod, or let its Deployment's ReplicaSet replace it"},
	{"allocate without API", LayerAllocate, func(e *evidence.Evidence) { e.Allocate = evidence.AllocateEvidence{Unread: unread} }, Unknown, unread, ""},

	{"cdi-runtime ok", LayerCDIRuntime, nil, OK, "handler nvidia", ""},
	{"unresolvable CDI name", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.CDI.Unresolved = []string{"nvidia.com/gpu=GPU-gone"}
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: pod("default", "p"), Reason: "CreateContainerError", Message: "failed to inject CDI devices: unresolvable CDI devices nvidia.com/gpu=GPU-gone"}}
	}, Broken, "GPU-gone resolves to no device", "restart nvinject-device-plugin"},
	{"bad spec file", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.CDI.Errors = []evidence.SpecError{{Path: "/var/run/cdi/x.yaml", Error: "invalid"}}
	}, Broken, "x.yaml", "remove the bad spec"},
	{"shadowed devices beyond the bound are counted", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.CDI.Specs = append(e.CDI.Specs, evidence.SpecFile{Path: "/var/run/cdi/z.yaml", Priority: 1, Kind: "nvidia.com/gpu", Devices: 40})
		e.CDI.Shadowed = []evidence.ShadowedDevice{{Name: "nvidia.com/gpu=" + uuid, Files: []string{ownSpec, "/var/run/cdi/z.yaml"}, Own: true}}
		e.CDI.ShadowedTotal, e.CDI.OwnLost = 30, 12
	}, Broken, "…and 11 more of nvinject's CDI devices shadowed (29 more shadowed in all)", "rm /var/run/cdi/z.yaml"},
	{"shadowed devices nvinject does not lose", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.CDI.Shadowed = []evidence.ShadowedDevice{{Name: "nvidia.com/gpu=all", Files: []string{"/etc/cdi/nvidia.yaml", ownSpec}, Winner: ownSpec, Own: true}}
		e.CDI.ShadowedTotal = 5
	}, OK, "…and 4 more devices defined in more than one file", ""},
	{"nvinject's all device taken by NVIDIA's toolkit spec", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.CDI.Shadowed = []evidence.ShadowedDevice{{Name: "nvidia.com/gpu=all", Files: []string{ownSpec, "/var/run/cdi/nvidia.yaml"}, Own: true}}
		e.CDI.ShadowedTotal = 1
	}, OK, "nvinject hands out no such name", ""},
	{"CDI spec dir unreadable", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.CDI.RuntimeUnread = "list CDI spec dir /etc/cdi: permission denied"
	}, Unknown, "could not read the CDI specs containerd reads: list CDI spec dir /etc/cdi", "--cdi-spec-dir"},
	{"nvinject's spec of another driver", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.PluginPod = evidence.DaemonEvidence{App: "single-gpu-device-plugin", Namespace: "nvidia-device-plugin"}
		e.CDI.Specs[0].DriverVersion = "535.261.03"
	}, Broken, "made from driver 535.261.03 (nvinject.io/driver-version) but driver 580.95.05 is installed in /", "delete pod -l app.kubernetes.io/name=single-gpu-device-plugin --field-selector spec.nodeName=k8s-ai-infra-worker"},
	{"nvinject's spec without a driver version", LayerCDIRuntime, func(e *evidence.Evidence) { e.CDI.Specs[0].DriverVersion = "" }, OK, "carries no nvinject.io/driver-version", ""},
	{"driver root without a driver", LayerCDIRuntime, func(e *evidence.Evidence) { e.DriverRoot.Version = "" }, OK, "holds no NVIDIA driver library", ""},
	{"RuntimeClass missing", LayerCDIRuntime, func(e *evidence.Evidence) { e.RuntimeCls = evidence.RuntimeClassEvidence{} }, Broken, "does not exist", "runtimeclass.yaml"},
	{"RuntimeClass wrong handler", LayerCDIRuntime, func(e *evidence.Evidence) { e.RuntimeCls.Handler = "runc" }, Broken, `handler "runc"`, "runtimeclass"},
	{"containerd lacks handler", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.Containerd.Handlers = []string{"runc"}
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: pod("default", "p"), Reason: "FailedCreatePodSandBox", Message: `rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for "nvidia" is configured`}}
	}, Broken, "no runtime handler", "install-containerd-config"},
	{"containerd misses the CDI dir", LayerCDIRuntime, func(e *evidence.Evidence) { e.Containerd.CDISpecDirs = []string{"/etc/cdi"} }, Broken, "does not read CDI specs from /var/run/cdi", "cdi"},
	{"NRI refusal", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.NRI.Refusals = map[string]float64{"runtime-class": 1}
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: evidence.PodRef{Namespace: "default", Name: "p", Container: "c"}, Reason: "CreateContainerError", Message: `nvinject: default/p/c requests nvidia.com/gpu but runs with runtime handler ""; set runtimeClassName: nvidia in the pod spec`}}
	}, Broken, "nvinject-nri refused default/p[c]", "refused"},
	{"NRI refusal by the default validator is the injection layer's", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: pod("default", "p"), Reason: "CreateContainerError", Message: refusedMsg}}
	}, OK, "refused it fail-closed (see the injection layer)", ""},
	{"unrelated create error", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: pod("default", "p"), Reason: "CreateContainerConfigError", Message: `secret "x" not found`}}
	}, OK, "not CDI/runtime", ""},
	{"cdi-runtime off node", LayerCDIRuntime, func(e *evidence.Evidence) {
		e.CDI = evidence.CDIEvidence{Dirs: e.CDI.Dirs, Unread: "no dir"}
		e.Containerd = evidence.ContainerdEvidence{Unread: "no file"}
	}, Unknown, "no file", "--containerd-config"},

	{"injection ok", LayerInjection, nil, OK, "nvinject_nri_connected=1", ""},
	{"NRI disconnected", LayerInjection, func(e *evidence.Evidence) { e.NRI.Connected = f64(0) }, Broken, "not connected to containerd (nvinject_nri_connected 0)", "dial error"},
	{"refused though connected: plugin name differs", LayerInjection, func(e *evidence.Evidence) {
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: pod("default", "p"), Reason: "CreateContainerError", Message: refusedMsg}}
	}, Broken, "though nvinject-nri looks connected", "nri.pluginName"},
	{"injection without metrics", LayerInjection, func(e *evidence.Evidence) { e.NRI.MetricsUnread = "connection refused" }, Unknown, "connection refused", "--nri-metrics"},

	{"application ok", LayerApplication, nil, OK, "running and ready", ""},
	{"CUDA init fails", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0] = evidence.ContainerState{Name: "vllm", State: "waiting", Reason: "CrashLoopBackOff", Restarts: 3, ExitCode: 1,
			LogTail: "INFO starting\nRuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version\n"}
	}, Broken, "CUDA driver version is insufficient", "driver version"},
	{"crash without CUDA text", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0] = evidence.ContainerState{Name: "vllm", State: "terminated", Reason: "Error", ExitCode: 2, LogTail: "ValueError: bad --max-model-len\n"}
	}, Broken, "last log line: ValueError", "vLLM's arguments"},
	{"not started", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0] = evidence.ContainerState{Name: "vllm", State: "waiting", Reason: "CreateContainerError"}
	}, Unknown, "not started", "earlier layers"},
	{"no pods", LayerApplication, func(e *evidence.Evidence) { e.App.Pods = nil }, Unknown, "no pod matches app=vllm-demo", "deploy/examples/vllm"},
	{"application without API", LayerApplication, func(e *evidence.Evidence) { e.App = evidence.AppEvidence{Selector: "app=vllm-demo", Unread: unread} }, Unknown, unread, "--pod-selector"},
	{"nvinject-dra also runs on a device-plugin node", LayerRegistration, func(e *evidence.Evidence) {
		e.DRAPod = running(contract.DRAApp)
	}, Broken, "nvinject-dra also runs on k8s-ai-infra-worker (pod nvidia-device-plugin/nvinject-dra-x1 Running ready=true restarts=0): two owners of nvidia.com/gpu", "label it nvinject.io/gpu-mode=dra or =device-plugin"},
	{"device plugin crash-loops", LayerRegistration, func(e *evidence.Evidence) {
		e.NodeStatus = evidence.NodeEvidence{}
		e.PluginPod = crashing(contract.DevicePluginApp, "GPU 0 has MIG mode on")
		e.Plugin = evidence.PluginEvidence{URL: e.Plugin.URL, Unread: "connection refused"}
	}, Broken, "nvinject-device-plugin is not running on k8s-ai-infra-worker: pod nvidia-device-plugin/single-gpu-device-plugin-x1 Running ready=false restarts=4 waiting=CrashLoopBackOff; last run ended Error (exit code 1): GPU 0 has MIG mode on", "correct what the daemon's last error says"},
	{"no device plugin pod on the node", LayerRegistration, func(e *evidence.Evidence) {
		e.NodeStatus = evidence.NodeEvidence{}
		e.PluginPod = evidence.DaemonEvidence{App: contract.DevicePluginApp, Namespace: contract.Namespace}
		e.Plugin = evidence.PluginEvidence{Unread: "no metrics URL"}
	}, Broken, "no single-gpu-device-plugin pod (app.kubernetes.io/name=single-gpu-device-plugin in nvidia-device-plugin) on the node", "the DaemonSet is missing (kubectl apply -k deploy)"},
	{"capacity kept by a stopped plugin is no health event", LayerHealth, func(e *evidence.Evidence) {
		e.NodeStatus.Allocatable = 0
		e.PluginPod = crashing(contract.DevicePluginApp, "boom")
	}, Broken, "allocatable=0 because nvinject-device-plugin stopped", "correct what the daemon's last error says"},
	{"nvinject-nri crash-loops", LayerInjection, func(e *evidence.Evidence) {
		e.NRIPod = crashing(contract.NRIApp, "connect to NRI socket /var/run/nri/nri.sock: no such file or directory")
		e.NRI.MetricsUnread = "connection refused"
	}, Broken, "nvinject-nri is not running on k8s-ai-infra-worker, so containerd refuses every GPU pod there (fail-closed)", "correct what the daemon's last error says"},
	{"nvinject-nri cannot mount the NRI socket dir", LayerInjection, func(e *evidence.Evidence) { e.NRIPod = nriPending("nri-socket") },
		Broken, "event FailedMount: MountVolume.SetUp failed for volume \"nri-socket\"", "set its hostPath in the nvinject-nri DaemonSet (volume nri-socket in deploy/base/nri-daemonset.yaml"},
	{"nvinject-nri cannot mount a volume of its own", LayerInjection, func(e *evidence.Evidence) { e.NRIPod = nriPending("extra") },
		Broken, "volume \"extra\"", "a path that exists on the node"},
	{"no nvinject-nri pod on the node", LayerInjection, func(e *evidence.Evidence) {
		e.NRIPod = evidence.DaemonEvidence{App: contract.NRIApp, Namespace: contract.Namespace}
	}, Broken, "no nvinject-nri pod on k8s-ai-infra-worker, so containerd refuses every GPU pod there (fail-closed)", "does not select the node"},
	{"refused while nvinject-nri is down is a fact of its problem", LayerInjection, func(e *evidence.Evidence) {
		e.NRI.Connected = f64(0)
		e.NRI.CreateErrors = []evidence.PodMessage{{PodRef: pod("default", "p"), Reason: "CreateContainerError", Message: refusedMsg}}
	}, Broken, "containerd refused default/p fail-closed: " + strconv.Quote(refusedMsg), "dial error"},
	{"nvinject_nri_connected absent", LayerInjection, func(e *evidence.Evidence) { e.NRI.Connected = nil }, Unknown, "nvinject_nri_connected is absent", "--nri-metrics"},
	{"GPU pod refused fail-closed", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0] = evidence.ContainerState{Name: "vllm", State: "waiting", Reason: "CreateContainerError", Message: refusedMsg}
	}, Broken, "default/vllm-demo-1[vllm] CreateContainerError: refused fail-closed because nvinject-nri is not connected: see the injection layer", "fix the injection layer (nvinject-nri) first"},
	{"probe: every library loads, CUDA sees no device", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0].Probe = &evidence.ProbeResult{AllLoaded: true, Libraries: []evidence.ProbeLib{{Name: "libcuda.so.1", OK: true}},
			Calls: []evidence.ProbeCallRC{{Call: "cuInit(0)", Code: 100, Name: "CUDA_ERROR_NO_DEVICE"}}}
	}, OK, "gpu-probe: all 1 driver libraries load; cuInit(0) = 100 CUDA_ERROR_NO_DEVICE", ""},
	{"probe: a driver library does not load", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0].Probe = &evidence.ProbeResult{Libraries: []evidence.ProbeLib{{Name: "libcuda.so.1", OK: true}, {Name: "libnvidia-nvvm.so.4", Error: "cannot open shared object file"}}}
	}, Broken, "libnvidia-nvvm.so.4 does not load in the container (driver/user-space compatibility): cannot open shared object file", "regenerate the CDI spec"},
	{"probe: cuInit fails", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0].Probe = &evidence.ProbeResult{AllLoaded: true, Libraries: []evidence.ProbeLib{{Name: "libcuda.so.1", OK: true}},
			Calls: []evidence.ProbeCallRC{{Call: "cuInit(0)", Code: 803, Name: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"}}}
	}, Broken, "cuInit(0) = 803 CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (driver/user-space compatibility)", "compare the driver version"},
	{"probe not in the image", LayerApplication, func(e *evidence.Evidence) {
		e.App.Pods[0].Containers[0].Probe = &evidence.ProbeResult{Unread: "gpu-probe --json gave no report"}
	}, OK, "no in-container probe (gpu-probe --json gave no report)", ""},
}

func TestDevicePluginTable(t *testing.T) { runCases(t, healthy, devicePluginCases) }

// runCases judges each case's evidence, changed from base, and checks the
// verdict of its layer.
func runCases(t *testing.T, base func() evidence.Evidence, cases []verdictCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			e := base()
			if tt.mutate != nil {
				tt.mutate(&e)
			}
			r := Report{Verdicts: Evaluate(e)}
			v, ok := r.Verdict(tt.layer)
			if !ok {
				t.Fatalf("no verdict for %s", tt.layer)
			}
			ev := strings.Join(v.Evidence, "\n")
			if v.Status != tt.want || !strings.Contains(ev, tt.evidence) || !strings.Contains(v.Fix, tt.fix) {
				t.Errorf("%s = %s\nevidence:\n%s\nfix: %s\nwant %s with evidence %q and fix %q", tt.layer, v.Status, ev, v.Fix, tt.want, tt.evidence, tt.fix)
			}
			if tt.want == OK && v.Fix != "" {
				t.Errorf("ok verdict carries a fix: %s", v.Fix)
			}
			if tt.want == Broken && v.Fix == "" {
				t.Errorf("broken verdict without a fix")
			}
		})
	}
}

// TestEveryCheckCovered: each check of both tables has a case where it is
// ok and one where it is broken, so a check the cases miss fails here.
func TestEveryCheckCovered(t *testing.T) {
	for _, m := range []struct {
		name  string
		table []Check
		cases []verdictCase
	}{{"device plugin", DevicePlugin, devicePluginCases}, {"DRA", DRA, draCases}} {
		seen := map[Layer]map[Status]bool{}
		for _, c := range m.cases {
			if seen[c.layer] == nil {
				seen[c.layer] = map[Status]bool{}
			}
			seen[c.layer][c.want] = true
		}
		for _, c := range m.table {
			if !seen[c.Layer][OK] || !seen[c.Layer][Broken] {
				t.Errorf("%s table: layer %s has cases %v, want ok and broken ones", m.name, c.Layer, seen[c.Layer])
			}
		}
	}
}

// TestTables: both tables walk the chain's layers in order, and each row
// says what it answers and reads, so --explain and the report can pair them.
func TestTables(t *testing.T) {
	chain := []Layer{LayerDriver, LayerRegistration, LayerHealth, LayerScheduling, LayerAllocate, LayerInjection, LayerCDIRuntime, LayerApplication}
	for name, table := range map[string][]Check{"device plugin": DevicePlugin, "DRA": DRA} {
		if len(table) != len(chain) {
			t.Fatalf("%s table has %d checks, want %d", name, len(table), len(chain))
		}
		for i, c := range table {
			if c.Layer != chain[i] || c.Symptom == "" || c.Row == "" || c.Reads == "" || c.Eval == nil {
				t.Errorf("%s table row %d = %+v, want layer %s with symptom, row, reads and eval", name, i, c, chain[i])
			}
		}
	}
	for i, c := range DevicePlugin {
		if d := DRA[i]; d.Row != c.Row {
			t.Errorf("layer %s answers troubleshooting row %q on a DRA node, %q on a device-plugin node", c.Layer, d.Row, c.Row)
		}
	}
}

// TestTable: the DRA table judges a node collected in DRA mode, the device
// plugin's every other (a forced device-plugin mode, or DRA mode whose DRA
// evidence is missing).
func TestTable(t *testing.T) {
	dra := healthyDRA()
	forced := healthyDRA()
	forced.Mode = evidence.ModeEvidence{Mode: contract.DRAModeDevicePlugin, Source: "--mode device-plugin"}
	bare := healthyDRA()
	bare.DRA = nil
	for _, tc := range []struct {
		name string
		e    evidence.Evidence
		want []Check
	}{{"DRA", dra, DRA}, {"forced device plugin", forced, DevicePlugin}, {"DRA without its evidence", bare, DevicePlugin}, {"device plugin", healthy(), DevicePlugin}} {
		got := Table(tc.e)
		if len(got) != len(tc.want) || got[1].Symptom != tc.want[1].Symptom {
			t.Errorf("%s: table with registration %q, want %q", tc.name, got[1].Symptom, tc.want[1].Symptom)
		}
	}
}

// TestHealthyChain: the working chain is ok on every layer and nothing is
// broken, so the command exits 0.
func TestHealthyChain(t *testing.T) {
	r := Report{Verdicts: Evaluate(healthy())}
	for _, v := range r.Verdicts {
		if v.Status != OK {
			t.Errorf("%s = %s: %v", v.Layer, v.Status, v.Evidence)
		}
	}
	if len(r.Verdicts) != 8 || len(r.Broken()) != 0 {
		t.Errorf("verdicts %d broken %v", len(r.Verdicts), r.Broken())
	}
}

// TestNothingReadable: with no input at all no layer claims ok.
func TestNothingReadable(t *testing.T) {
	const why = "unreadable"
	e := evidence.Evidence{Resource: "nvidia.com/gpu", RuntimeClass: "nvidia",
		SMI: evidence.SMIEvidence{Unread: why}, KubeletDir: evidence.KubeletDirEvidence{Unread: why}, Plugin: evidence.PluginEvidence{Unread: why},
		NodeStatus: evidence.NodeEvidence{Unread: why}, Selected: evidence.SelectedEvidence{Unread: why}, Ledger: evidence.LedgerEvidence{Unread: why},
		Allocate: evidence.AllocateEvidence{Unread: why}, CDI: evidence.CDIEvidence{Unread: why}, RuntimeCls: evidence.RuntimeClassEvidence{Unread: why},
		Containerd: evidence.ContainerdEvidence{Unread: why}, NRI: evidence.NRIEvidence{MetricsUnread: why, ErrorsUnread: why}, App: evidence.AppEvidence{Unread: why}}
	for _, v := range Evaluate(e) {
		if v.Status != Unknown || v.Fix == "" {
			t.Errorf("%s = %s (fix %q), want unknown with a hint", v.Layer, v.Status, v.Fix)
		}
	}
}

func pod(ns, name string) evidence.PodRef { return evidence.PodRef{Namespace: ns, Name: name} }

// running is app's pod on the node, running.
func running(app string) evidence.DaemonEvidence {
	return evidence.DaemonEvidence{App: app, Namespace: contract.Namespace, Pod: app + "-x1", Phase: "Running", Ready: true}
}

// crashing is app's pod crash-looping, its last run ended with lastError.
func crashing(app, lastError string) evidence.DaemonEvidence {
	d := running(app)
	d.Ready, d.Restarts, d.Waiting, d.LastError = false, 4, "CrashLoopBackOff", "Error (exit code 1): "+lastError
	return d
}

// nriPending is nvinject-nri's pod Pending: kubelet cannot mount volume.
func nriPending(volume string) evidence.DaemonEvidence {
	d := running(contract.NRIApp)
	d.Phase, d.Ready, d.Waiting = "Pending", false, "ContainerCreating"
	d.Events = []evidence.DaemonEvent{{Reason: "FailedMount", Message: `MountVolume.SetUp failed for volume "` + volume + `" : hostPath type check failed: /var/run/nri is not a directory`}}
	return d
}
