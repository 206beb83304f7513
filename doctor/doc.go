// Package doctor walks the chain of one nvidia.com/gpu request (driver →
// device plugin → scheduler → kubelet Allocate → NRI plugin → CDI/containerd →
// application) on a node and gives each row of the GPU troubleshooting
// table a verdict: ok, broken or unknown, with the evidence it read and
// the fix.
//
// Its packages are its pipeline; data flows left to right:
//
//	collect ──▶ evidence ──▶ check ──▶ render
//	all I/O     plain data   pure      text, JSON
//	and Options              verdicts
//
// evidence imports no doctor package, collect and check import evidence and
// not each other, render imports check; TestPipelineImports fails on any
// other import, and on one from evidence or check that could do I/O.
//
// collect (with its I/O helpers ctrdconfig, kubeexec, promtext, smi) reads
// nvidia-smi, the kubelet device-plugins dir and PodResources, the daemons'
// /metrics, the CDI spec dirs (also in containerd's order, for the devices
// more than one spec defines) and MPS control sockets, the driver root's
// installed version, containerd's config and the API server into an
// evidence.Evidence; check judges it with one table of checks per mode
// (check.DevicePlugin, check.DRA), pure functions that import only
// evidence; render writes the verdicts. Run wires them for the command and
// for in-process callers. An input that cannot be read makes its layers
// unknown, never ok.
//
// Faults and the layer that reports them (for e2e/harness/kubelocal fault tests,
// which call Run in-process):
//
//	fault                                     layer         verdict evidence / fix
//	nvidia-smi fails, no GPU, selected UUID   driver        broken  nvidia-smi output / host driver, toolkit, nvkind, selected-gpu-uuid
//	  not on the worker
//	device plugin not registered (stopped,    registration  broken  no plugin socket, registrations=0, no ListAndWatch,
//	  kubelet.sock gone)                                            Node without capacity / plugin logs, restart plugin or kubelet
//	unhealthy device (POST /debug/sim/xid     health        broken  allocatable < capacity, device Unhealthy with its Xid /
//	  ?uuid=&xid= on the plugin)                                    quiet period, SIGHUP, POST /debug/sim/recover?uuid=
//	MIG layout changed, not republished;      registration  broken  the MIG devices live but unpublished, or published but
//	  a MIG GPU under MIG_STRATEGY=none                             gone (CDI spec, Node capacity, ResourceSlice) / run again
//	                                                                after --mig-rescan-interval, daemon logs, restart its pod;
//	                                                                set MIG_STRATEGY=single|mixed
//	GPU taken by another pod                  scheduling    broken  pending pod's "Insufficient nvidia.com/gpu" and the
//	                                                                holders / delete or scale down the holder
//	Allocate fails in the plugin              allocate      broken  pod status "Allocate failed" / plugin logs, re-register
//	shared GPU held by more pods than its     allocate      broken  the device, its shared-replicas and the pods (kubelet's
//	  replicas, an exclusive one by two                             PodResources) / delete the newest pods, restore replicas
//	MPS control daemon down                   allocate      broken  the device and its mps-pipe-dir control socket / device
//	                                                                plugin logs, restart its pod
//	nvinject-nri not connected (pod Pending   injection     broken  its pod's waiting reason, last error and events (FailedMount
//	  on a missing hostPath, crash-looping,                         with the path), nvinject_nri_connected 0, GPU pods refused
//	  no pod, disconnected)                                         "required plugin "nvinject" not present" / the DaemonSet
//	                                                                volume to set, nvinject-nri logs; the refused pods' application
//	                                                                layer points here
//	unresolvable CDI name (spec removed or    cdi-runtime   broken  name resolves to no device, CreateContainerError text /
//	  stale, selected UUID not in the spec)                         restart the plugin to rewrite its spec
//	a spec shadows nvinject's (a leftover of  cdi-runtime   broken  the device, the files defining it in containerd's dir order,
//	  an earlier install, NVIDIA's toolkit's                        the one containerd takes / remove the named files
//	  nvidia.yaml) or a spec file is malformed                      (a malformed one is named, the others still judged)
//	nvinject's spec made from another driver  cdi-runtime   broken  the spec, its nvinject.io/driver-version, the driver root's
//	  than the driver root's                                        version / the daemon restarts on a driver change, else
//	                                                                delete its pod; start no GPU container meanwhile
//	RuntimeClass nvidia missing / no nvidia   cdi-runtime   broken  RuntimeClass or containerd handler absent /
//	  handler in containerd                                         kubectl apply -k deploy, nvinject-node install-containerd-config
//	NRI refusal (wrong runtimeClassName,      cdi-runtime   broken  "nvinject: ..." in the container error, refusal metrics /
//	  UUID mismatch)                                                the refusal's own fix
//	CUDA cannot initialise / app crashes      application   broken  CUDA error line or exit code from the pod log /
//	                                                                driver vs CUDA version, vLLM arguments
//
// On a DRA-mode node (label nvinject.io/gpu-mode=dra, or nvinject-dra alone
// on it) the registration, health, scheduling and allocate layers read DRA's
// objects instead (check.DRA):
//
//	fault                                     layer         verdict evidence / fix
//	nvinject-dra down or unregistered, no     registration  broken  its pod's last error, registered=0, no slice, DeviceClass
//	  ResourceSlice or DeviceClass, a second                        missing or without extendedResourceName, allocatable > 0 /
//	  owner (device plugin, allocatable > 0)                        logs, hostPaths, apply deploy/overlays/dra-node, relabel
//	Xid (POST /debug/sim/xid on nvinject-dra) health        broken  the device's taint, the pod's allocatedResourcesStatus /
//	                                                                quiet period, SIGHUP, recover
//	every device allocated                    scheduling    broken  the pending pod's message and the claims holding devices
//	NodePrepareResources fails, claim holds   allocate      broken  FailedPrepareDynamicResources text, the stale device /
//	  a device no longer published                                  nvinject-dra's logs, delete the pod
//
// Report.Broken lists broken layers in chain order; the first is where to
// start, since later layers depend on earlier ones.
//
// RunExplain (`nvinject-doctor explain POD`) follows one pod the same way:
// collect.Pod reads the pod, its ResourceClaims, the audit Events
// nvinject-nri recorded on it (contract.EventReasonGPUAdmitted and
// EventReasonGPURefused, each note a contract.AuditNote) and nvinject-nri's
// audit metrics on its node into an evidence.ExplainEvidence; check.Explain
// turns that, without I/O, into each container's chain (requested →
// allocated → kubelet assigned → CDI names → checked → verdict → now), or
// says why no record explains it; render.WriteExplanation writes it.
//
// Package fleet (`nvinject-doctor --all-nodes`) stands beside the pipeline:
// from the API server alone (Nodes, nvinject's daemon pods, the DRA
// driver's ResourceSlices, a not-Ready daemon's /readyz through the pod
// proxy) it makes one row per GPU node, its layers node, owner, nri,
// published, health and driver, and names the first broken one with its
// fix; the node's own walk then goes deeper.
package doctor
