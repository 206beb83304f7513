package check

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

const (
	pluginLogs    = "kubectl -n " + contract.Namespace + " logs ds/" + contract.DevicePluginApp + " --tail=100"
	fixDriver     = "check the host driver (nvidia-smi on the host, dmesg | grep -i -e nvrm -e xid), the NVIDIA Container Toolkit, and that nvkind passed the GPU into the worker (docker exec <worker> ls -l /dev/nvidia*)"
	fixSelected   = "set " + contract.ConfigMapKey + " in ConfigMap " + contract.Namespace + "/" + contract.ConfigMapName + " to a UUID nvidia-smi lists on the worker, or give that GPU to the worker"
	fixKubelet    = "start kubelet on the node, or pass --kubelet-dir if its root dir is not /var/lib/kubelet"
	fixPluginDown = "nvinject-device-plugin is not serving: " + pluginLogs + "; check the DaemonSet's nodeSelector matches the worker"
	fixNoDevices  = "the plugin sees no GPU: selected-gpu-uuid must name a GPU nvidia-smi lists on the worker"
	fixRecover    = "the plugin reports the GPU Unhealthy (Xid or lost GPU): read the host's dmesg for the Xid; nvinject turns it Healthy after --health-quiet-period without a new Xid, or at once on SIGHUP to the plugin (on a simulated node: POST /debug/sim/recover?uuid=<uuid> on the plugin's metrics port); a lost GPU needs a reset or reboot"
	fixAllocate   = "kubelet's Device Manager got no devices from the plugin: " + pluginLogs + ", check the device is still healthy, restart the plugin pod so it re-registers, then delete the failed pod so its controller recreates it"
	// kubelet restores GPU assignments from its checkpoint at start and frees
	// those of deleted pods only once it has seen all its pod sources.
	fixAdmissionRace = "kubelet admitted the pod right after it restarted, while its device-manager checkpoint still gave the GPU to a deleted pod (a known kubelet race: kubernetes/kubernetes#117955, #124345, #133382): delete the failed pod, or let its Deployment's ReplicaSet replace it; if it repeats long after kubelet started, look in kubelet's checkpoint (/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint) for pods that no longer exist"
	fixCDISpec       = "fix or remove the bad spec file; restart nvinject-device-plugin to rewrite its spec in /var/run/cdi"
	fixCDIName       = "the CDI spec for that GPU is missing or stale: restart nvinject-device-plugin (it writes the spec to /var/run/cdi) and make sure containerd's cdi_spec_dirs list that dir"
	fixCDIDirs       = "add the dir to cdi_spec_dirs in containerd's config (nvinject's drop-in lists /etc/cdi and /var/run/cdi) and restart containerd"
	fixRC            = "kubectl apply -k deploy (deploy/manifests/runtimeclass.yaml defines RuntimeClass nvidia with handler nvidia)"
	fixHandler       = "install nvinject's containerd drop-in: nvinject-node install-containerd-config, then restart containerd (on nvkind: docker exec <worker> systemctl restart containerd)"
	fixRefusal       = "nvinject-nri refused the container; its message says what differs (runtimeClassName, stale CDI spec, GPU UUID mismatch, a GPU another pod holds): correct that, then delete the pod; `nvinject-doctor explain --pod-namespace NS POD` shows kubelet's assignment, the CDI names and what nvinject-nri checked"
	fixProbeLib      = "the container lacks a library of the driver: regenerate the CDI spec from the driver root (the device plugin writes it; with --hook-binary the ld.so.cache and libcuda.so links are made too) and check the root holds that library (nvinject-cdi generate --driver-root=...)"
	fixApp           = "the device is in the container but CUDA cannot use it: compare the driver version (nvidia-smi) with the CUDA the image needs, check vLLM's arguments (--gpu-memory-utilization, --max-model-len, model) and read the pod's log"
)

// The device plugin's withheld GPUs (deviceplugin/README.md).
const (
	fixPodResources = "nvinject-device-plugin cannot read kubelet's PodResources, so it withholds every GPU (fail closed): mount kubelet's pod-resources dir (/var/lib/kubelet/pod-resources, as deploy/ does) into its pod and point --pod-resources-socket at the kubelet.sock there; the error is in " + pluginLogs
	fixDRAHeldPod   = "a pod holds the GPU through a DRA claim (the node moved back to the device plugin while it ran, or both paths run): the plugin publishes it Healthy once that pod ends; delete or drain that pod, or finish the move the other way (label the node " + contract.DRAModeLabel + "=" + contract.DRAModeDRA + " again) until it ends"
)

func num(p *float64) string {
	if p == nil {
		return "absent"
	}
	return strconv.FormatFloat(*p, 'f', -1, 64)
}

func checkDriver(e evidence.Evidence) Verdict {
	var f finding
	s := e.SMI
	switch {
	case s.Unread != "":
		f.unread("nvidia-smi "+s.Path, s.Unread)
	case s.Failed != "":
		f.problem(fixDriver, "%s failed: %s: %s", s.Path, s.Failed, firstLines(s.Output, 3))
	case len(s.GPUs) == 0:
		f.problem(fixDriver, "%s lists no GPU: %s", s.Path, firstLines(s.Output, 3))
	default:
		for _, g := range s.GPUs {
			f.fact("nvidia-smi: GPU %s %s %s mig=%s", g.Index, g.UUID, g.Name, g.MIGMode)
			if p := g.MIGPending; p != "" && p != "[N/A]" && p != g.MIGMode {
				f.problem(fmt.Sprintf("drain the node's GPU pods, then reset GPU %s (nvidia-smi -i %s -r) or reboot, and restart the device plugin or nvinject-dra so it publishes the GPU as it then is", g.Index, g.Index),
					"GPU %s (%s) has MIG mode %s pending a reset (now %s): until the reset it is published as %s, and the reset will change what it publishes", g.Index, g.UUID, p, g.MIGMode, g.MIGMode)
			}
		}
		if sel := e.Selected; sel.Unread == "" && !sel.All {
			for _, u := range sel.UUIDs {
				if !slices.ContainsFunc(s.GPUs, func(g evidence.GPU) bool { return g.UUID == u }) {
					f.problem(fixSelected, "selected GPU %s (%s) is not among the GPUs nvidia-smi lists", u, sel.Source)
				}
			}
		}
	}
	return f.verdict("pass --nvidia-smi with a command that reaches the worker (\"docker exec <worker> nvidia-smi\"; on a simulated node a GPU pod: \"kubectl exec <pod> -- nvidia-smi\")")
}

// registrationCauses explains, from node-local evidence, why the resource
// would be missing. Only the first cause in chain order is a problem; what
// follows from it (no registration without kubelet.sock, no stream without
// a registration) is kept as a fact.
func registrationCauses(e evidence.Evidence, f *finding) {
	k, p := e.KubeletDir, e.Plugin
	if k.Unread == "" {
		f.fact("%s: kubelet.sock present=%t, plugin sockets %v", k.Dir, k.KubeletSocket, k.PluginSockets)
	}
	if p.Unread == "" {
		f.fact("plugin metrics: registrations ok=%s error=%s listAndWatchStreams=%s devices=%d", num(p.Registrations), num(p.RegistrationErrors), num(p.Streams), len(p.Devices))
	}
	d := e.PluginPod
	if d.Known() {
		f.fact("nvinject-device-plugin: %s", d.Describe())
	}
	switch {
	case k.Unread == "" && !k.KubeletSocket:
		f.problem(fixKubelet, "no kubelet.sock in %s: kubelet is not running or uses another root dir", k.Dir)
	case d.Known() && !d.Running() && podResourcesDown(p):
		f.problem(fixPodResources, "nvinject-device-plugin on %s is not ready: it cannot read kubelet's PodResources (%s holder=%s): %s", e.Node, contract.MetricGPUHeld, contract.HeldUnknown, d.Describe())
	case d.Known() && !d.Running() && (d.Pod != "" || p.Unread != ""):
		f.problem(daemonFix(d), "nvinject-device-plugin is not running on %s: %s", e.Node, d.Describe())
	case k.Unread == "" && len(k.PluginSockets) == 0:
		f.problem(fixPluginDown, "no device plugin socket in %s", k.Dir)
	case p.Unread != "":
	case len(p.Devices) == 0:
		f.problem(fixNoDevices, "the device plugin publishes no device")
	case p.Registrations != nil && *p.Registrations == 0:
		f.problem(fixPluginDown, "the device plugin never registered with kubelet (registrations ok=0, error=%s)", num(p.RegistrationErrors))
	case p.Streams != nil && *p.Streams == 0:
		f.problem("restart the device plugin pod so it registers again; kubelet opens ListAndWatch right after a successful Register", "kubelet has no ListAndWatch stream open to the plugin")
	}
}

func checkRegistration(e evidence.Evidence) Verdict {
	var f finding
	ownerFacts(e, &f)
	migFindings(e, &f)
	n := e.NodeStatus
	if n.Unread == "" && n.Published && n.Capacity > 0 {
		// kubelet keeps an earlier registration's capacity for a while
		// after the plugin is gone, so node-local causes still count.
		f.fact("Node %s capacity %s=%d", e.Node, e.Resource, n.Capacity)
		registrationCauses(e, &f)
		return f.verdict("")
	}
	registrationCauses(e, &f)
	f.unread("the device-plugins dir", e.KubeletDir.Unread)
	f.unread("device plugin metrics "+e.Plugin.URL, e.Plugin.Unread)
	if n.Unread != "" {
		f.unread("the Node", n.Unread)
		return f.verdict("give the doctor the cluster (--kubeconfig, --node) so it can read the Node's capacity")
	}
	f.problems = append([]string{fmt.Sprintf("Node %s publishes no %s (capacity %d)", e.Node, e.Resource, n.Capacity)}, f.problems...)
	if len(f.fixes) == 0 {
		f.fixes = append(f.fixes, "check the plugin's registration: "+pluginLogs+" and kubelet's log for the plugin's Register")
	}
	f.missing = nil
	return f.verdict("")
}

func unhealthy(p evidence.PluginEvidence) []evidence.DeviceHealth {
	var out []evidence.DeviceHealth
	for _, d := range p.Devices {
		if !d.Healthy {
			out = append(out, d)
		}
	}
	return out
}

// podResourcesDown says whether the plugin withholds every GPU because it
// cannot read kubelet's PodResources.
func podResourcesDown(p evidence.PluginEvidence) bool {
	return slices.ContainsFunc(p.Held, func(h evidence.HeldGPU) bool { return h.Holder == contract.HeldUnknown })
}

// heldByDRA are the plugin's GPUs that DRA claims' pods hold.
func heldByDRA(p evidence.PluginEvidence) []evidence.HeldGPU {
	var out []evidence.HeldGPU
	for _, h := range p.Held {
		if h.Holder == contract.HeldByDRAClaim {
			out = append(out, h)
		}
	}
	return out
}

func checkHealth(e evidence.Evidence) Verdict {
	var f finding
	bad := unhealthy(e.Plugin)
	if e.Plugin.Unread == "" {
		for _, d := range e.Plugin.Devices {
			f.fact("plugin reports %s healthy=%t", d.UUID, d.Healthy)
		}
	}
	for _, d := range bad {
		f.problem(fixRecover, "device %s is Unhealthy%s", d.UUID, eventsNote(e.Plugin.HealthEvents))
	}
	// Withheld GPUs are published Unhealthy though NVML finds them healthy.
	down, byDRA := podResourcesDown(e.Plugin), heldByDRA(e.Plugin)
	if down {
		f.problem(fixPodResources, "nvinject-device-plugin publishes every GPU Unhealthy because it cannot read kubelet's PodResources (%s holder=%s), not for the GPUs' health", contract.MetricGPUHeld, contract.HeldUnknown)
	}
	for _, h := range byDRA {
		f.problem(fixDRAHeldPod, "device %s is published Unhealthy because pod %s holds it through DRA claim %s, not for its health", h.UUID, h.Pod, h.Claim)
	}
	n := e.NodeStatus
	switch {
	case n.Unread != "":
		if len(bad) == 0 && (e.Plugin.Unread != "" || len(e.Plugin.Devices) == 0) {
			f.unread("the Node", n.Unread)
			f.unread("device plugin metrics "+e.Plugin.URL, e.Plugin.Unread)
		}
	case !n.Published || n.Capacity == 0:
		f.missing = append(f.missing, fmt.Sprintf("Node %s publishes no %s, so there is no health to judge (see the registration layer)", e.Node, e.Resource))
	case n.Allocatable < n.Capacity && len(bad) == 0 && (down || len(byDRA) > 0):
		f.fact("Node %s capacity %s=%d allocatable=%d: the withheld device(s) above", e.Node, e.Resource, n.Capacity, n.Allocatable)
	case n.Allocatable < n.Capacity && len(bad) == 0 && e.PluginPod.Known() && !e.PluginPod.Running():
		f.problem(daemonFix(e.PluginPod), "Node %s capacity %s=%d but allocatable=%d because nvinject-device-plugin stopped (%s): kubelet keeps a gone plugin's capacity and counts its devices unavailable; no GPU health event is involved", e.Node, e.Resource, n.Capacity, n.Allocatable, e.PluginPod.Describe())
	case n.Allocatable < n.Capacity:
		f.problem(fixRecover, "Node %s capacity %s=%d but allocatable=%d: kubelet holds %d device(s) Unhealthy", e.Node, e.Resource, n.Capacity, n.Allocatable, n.Capacity-n.Allocatable)
	default:
		f.fact("Node %s capacity=%d allocatable=%d", e.Node, n.Capacity, n.Allocatable)
	}
	return f.verdict("give the doctor the cluster (--kubeconfig, --node) or the plugin's metrics (--device-plugin-metrics)")
}

// daemonFix tells how to get a stopped daemon's pod running again.
func daemonFix(d evidence.DaemonEvidence) string {
	logs := fmt.Sprintf("kubectl -n %s logs ds/%s --previous --tail=100", d.Namespace, d.App)
	switch {
	case d.Pod == "":
		return fmt.Sprintf("no %s pod runs on the node: the DaemonSet is missing (kubectl apply -k deploy) or does not select the node (kubectl -n %s get ds %s -o wide: check its nodeSelector and tolerations)", d.App, d.Namespace, d.App)
	case d.LastError != "":
		return "correct what the daemon's last error says (above), then it restarts by itself; more in " + logs
	}
	return "read why it does not start: kubectl -n " + d.Namespace + " describe pod " + d.Pod + "; " + logs
}

func eventsNote(events []string) string {
	if len(events) == 0 {
		return ""
	}
	return " (plugin counted health events: " + strings.Join(events, ", ") + ")"
}

func checkScheduling(e evidence.Evidence) Verdict {
	var f finding
	l := e.Ledger
	if l.Unread != "" {
		f.unread("pods and scheduler events", l.Unread)
		return f.verdict("give the doctor the cluster (--kubeconfig, --node)")
	}
	var held int64
	var holders []string
	for _, h := range l.Holders {
		held += h.GPUs
		holders = append(holders, fmt.Sprintf("%s (%d, %s)", h.PodRef, h.GPUs, h.Phase))
	}
	alloc := "unknown"
	if e.NodeStatus.Unread == "" {
		alloc = strconv.FormatInt(e.NodeStatus.Allocatable, 10)
	}
	f.fact("ledger on %s: %d %s requested by bound pods of %s allocatable; holders: %s", e.Node, held, e.Resource, alloc, orNone(holders))
	byDRA := heldByDRA(e.Plugin)
	if len(byDRA) > 0 {
		f.fact("held through DRA, so not allocatable: %s", orNone(draHolders(byDRA)))
	}
	insufficient := "Insufficient " + e.Resource
	for _, p := range l.Pending {
		if !strings.Contains(p.Message, insufficient) {
			continue
		}
		fix := "the node's ledger has room; the pod is steered elsewhere (nodeSelector, affinity, taints) or the message is stale: kubectl describe pod " + p.Name
		switch {
		case podResourcesDown(e.Plugin):
			fix = fixPodResources
		case len(byDRA) > 0 && e.NodeStatus.Unread == "" && held >= e.NodeStatus.Allocatable:
			fix = "the free GPU is held through DRA by " + orNone(draHolders(byDRA)) + ": " + fixDRAHeldPod
		case e.NodeStatus.Unread == "":
			if e.NodeStatus.Allocatable == 0 {
				fix = "the node has no allocatable GPU: fix the registration or health layer first"
			} else if held >= e.NodeStatus.Allocatable {
				fix = "every GPU on the node is held: free one (delete or scale down " + orNone(holders) + ") or add a GPU node"
			}
		case held > 0:
			fix = "free a GPU (delete or scale down " + orNone(holders) + ") or add a GPU node"
		}
		f.problem(fix, "pod %s Pending: %s", p.PodRef, p.Message)
	}
	return f.verdict("")
}

// draHolders names each withheld GPU's pod and claim.
func draHolders(hs []evidence.HeldGPU) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = fmt.Sprintf("pod %s (claim %s, %s)", h.Pod, h.Claim, h.UUID)
	}
	return out
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func checkAllocate(e evidence.Evidence) Verdict {
	var f finding
	if e.Plugin.Unread == "" && e.Plugin.AllocateErrors != nil {
		f.fact("plugin counted %s failed Allocate calls since it started", num(e.Plugin.AllocateErrors))
	}
	sharingFindings(e, &f)
	a := e.Allocate
	if a.Unread != "" {
		f.unread("pods and kubelet events", a.Unread)
		return f.verdict("give the doctor the cluster (--kubeconfig, --node)")
	}
	for _, p := range a.Failures {
		if p.Reason == "UnexpectedAdmissionError" && strings.Contains(p.Message, "requested number of devices unavailable for "+e.Resource) {
			f.problem(fixAdmissionRace, "pod %s: %s (kubelet's device-manager race after a restart)", p.PodRef, p.Message)
			continue
		}
		f.problem(fixAllocate, "pod %s: %s", p.PodRef, p.Message)
	}
	if len(a.Failures) == 0 {
		f.fact("no pod on %s was rejected with Allocate failed", e.Node)
	}
	return f.verdict("run the doctor as root on the worker (--pod-resources-socket), so it can read kubelet's PodResources and the MPS control sockets")
}

func checkCDIRuntime(e evidence.Evidence) Verdict {
	var f finding
	cdiFacts(e.CDI, &f)
	shadowFindings(e.CDI, &f)
	staleSpecFindings(e, &f)
	rc := e.RuntimeCls
	switch {
	case rc.Unread != "":
		f.unread("RuntimeClass "+e.RuntimeClass, rc.Unread)
	case !rc.Exists:
		f.problem(fixRC, "RuntimeClass %s does not exist", e.RuntimeClass)
	case rc.Handler != e.RuntimeClass:
		f.problem(fixRC, "RuntimeClass %s has handler %q, want %q", e.RuntimeClass, rc.Handler, e.RuntimeClass)
	default:
		f.fact("RuntimeClass %s handler %s", e.RuntimeClass, rc.Handler)
	}
	containerdFacts(e, &f)
	nriFacts(e.NRI, &f)
	return f.verdict("run the doctor on the worker with --cdi-spec-dir and --containerd-config, and give it the cluster (--kubeconfig)")
}

func cdiFacts(c evidence.CDIEvidence, f *finding) {
	if c.Unread != "" {
		f.unread("CDI specs in "+strings.Join(c.Dirs, ","), c.Unread)
		return
	}
	f.fact("CDI dirs %v: %d spec file(s), devices %v", c.Dirs, len(c.Files), c.Devices)
	if len(c.Files) == 0 {
		f.problem(fixCDIName, "no CDI spec file in %v (missing dirs: %v)", c.Dirs, c.MissingDirs)
	}
	specErrorFindings(c, f)
	for _, n := range c.Unresolved {
		f.problem(fixCDIName, "CDI device %s resolves to no device in %v", n, c.Dirs)
	}
	if resolved := len(c.Wanted) - len(c.Unresolved); len(c.Wanted) > 0 && resolved > 0 {
		f.fact("%d of the %d CDI names pods need resolve: %v", resolved, len(c.Wanted), c.Wanted)
	}
}

func containerdFacts(e evidence.Evidence, f *finding) {
	c := e.Containerd
	if c.Unread != "" {
		f.unread("containerd config "+c.Path, c.Unread)
		return
	}
	f.fact("containerd config %v: runtime handlers %v, cdi_spec_dirs %v", c.Files, c.Handlers, c.CDISpecDirs)
	if !slices.Contains(c.Handlers, e.RuntimeClass) {
		f.problem(fixHandler, "containerd config %s defines no runtime handler %q", c.Path, e.RuntimeClass)
	}
	if c.NRIDisabled {
		f.problem(fixHandler, "containerd config %s disables NRI, so nvinject-nri never sees containers", c.Path)
	}
	if len(c.CDISpecDirs) > 0 && e.CDI.Unread == "" {
		for _, d := range e.CDI.Dirs {
			if !slices.Contains(c.CDISpecDirs, d) && !slices.Contains(e.CDI.MissingDirs, d) {
				f.problem(fixCDIDirs, "containerd does not read CDI specs from %s (cdi_spec_dirs %v)", d, c.CDISpecDirs)
			}
		}
	}
}

func nriFacts(n evidence.NRIEvidence, f *finding) {
	if n.MetricsUnread != "" {
		f.fact("nvinject-nri metrics %s not read: %s", n.URL, n.MetricsUnread)
	} else {
		f.fact("nvinject-nri metrics: connected=%s refusals=%v", num(n.Connected), n.Refusals)
	}
	if n.ErrorsUnread != "" {
		f.unread("container errors on the node", n.ErrorsUnread)
		return
	}
	for _, c := range n.CreateErrors {
		switch msg := c.Message; {
		case requiredPluginRefusal(msg):
			f.fact("%s %s: containerd refused it fail-closed (see the injection layer)", c.PodRef, c.Reason)
		case strings.Contains(msg, "nvinject:"):
			f.problem(fixRefusal, "nvinject-nri refused %s: %s", c.PodRef, msg)
		case strings.Contains(strings.ToLower(msg), "cdi"):
			f.problem(fixCDIName, "%s %s: %s", c.PodRef, c.Reason, msg)
		case strings.Contains(msg, "runtime handler") || strings.Contains(msg, "no runtime for"):
			f.problem(fixHandler, "%s %s: %s", c.PodRef, c.Reason, msg)
		default:
			f.fact("%s %s (not CDI/runtime): %s", c.PodRef, c.Reason, msg)
		}
	}
}

// cudaFailures are log lines that mean CUDA could not initialise or use
// the device.
var cudaFailures = []string{
	"cuda error", "cudaerror", "cuda_error", "cuda driver version is insufficient",
	"no cuda-capable device", "cuda initialization", "failed to initialize nvml",
	"found no nvidia driver", "unsupported display driver / cuda driver combination",
	"forward compatibility was attempted", "cuda out of memory", "cuda is not available",
}

func cudaLine(log string) string {
	for _, line := range strings.Split(log, "\n") {
		l := strings.ToLower(line)
		for _, pat := range cudaFailures {
			if strings.Contains(l, pat) {
				return strings.TrimSpace(line)
			}
		}
	}
	return ""
}

func checkApplication(e evidence.Evidence) Verdict {
	var f finding
	a := e.App
	if a.Unread != "" {
		f.unread("pods "+a.Selector, a.Unread)
		return f.verdict("give the doctor the cluster (--kubeconfig), or the application's --pod-selector")
	}
	if len(a.Pods) == 0 {
		f.missing = append(f.missing, "no pod matches "+a.Selector)
		return f.verdict("deploy the application (kubectl apply -k deploy/examples/vllm) or pass --pod-selector")
	}
	for _, p := range a.Pods {
		appPod(p, &f)
	}
	return f.verdict("the container has not started; fix the earlier layers first")
}

func appPod(p evidence.AppPod, f *finding) {
	if len(p.Containers) == 0 {
		f.missing = append(f.missing, fmt.Sprintf("pod %s is %s with no container started", p.PodRef, p.Phase))
		return
	}
	for _, c := range p.Containers {
		ref := evidence.PodRef{Namespace: p.Namespace, Name: p.Name, Container: c.Name}
		probeFindings(ref, c.Probe, f)
		if line := cudaLine(c.LogTail); line != "" {
			f.problem(fixApp, "%s log: %s", ref, line)
			continue
		}
		switch {
		case c.State == "waiting" && requiredPluginRefusal(c.Message):
			f.problem(fixRefusedApp, "%s %s: refused fail-closed because nvinject-nri is not connected: see the injection layer (containerd: %s)", ref, c.Reason, contract.Quote(c.Message))
		case c.State == "terminated" && c.ExitCode != 0, c.Reason == "CrashLoopBackOff", c.Reason == "Error":
			f.problem(fixApp, "%s %s %s exit=%d restarts=%d: %s%s", ref, c.State, c.Reason, c.ExitCode, c.Restarts, c.Message, lastLine(c.LogTail))
		case c.State == "running" && c.Ready:
			f.fact("%s running and ready (restarts %d)", ref, c.Restarts)
		case c.State == "running":
			f.fact("%s running, not ready yet (restarts %d)", ref, c.Restarts)
			f.missing = append(f.missing, ref.String()+" is not ready yet")
		default:
			f.missing = append(f.missing, fmt.Sprintf("%s %s %s: not started (see the earlier layers)", ref, c.State, c.Reason))
		}
		if c.LogUnread != "" {
			f.fact("%s log not read: %s", ref, c.LogUnread)
		}
	}
}

func lastLine(log string) string {
	lines := strings.Split(strings.TrimSpace(log), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return "; last log line: " + l
	}
	return ""
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " | ")
}
