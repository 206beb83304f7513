package check

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// The DRA path's fixes.
const (
	draLogs        = "kubectl -n " + contract.Namespace + " logs ds/" + contract.DRAApp + " --tail=100"
	fixDRARegister = "kubelet has not accepted nvinject-dra's registration: check that its registrar and plugins hostPaths are kubelet's root dir (<root>/plugins_registry, <root>/plugins) and read " + draLogs
	fixDRASlice    = "nvinject-dra publishes the node's ResourceSlice once registered: read " + draLogs + " for the publication error (RBAC of ServiceAccount nvinject-dra, API access)"
	fixDRANoDevice = "nvinject-dra publishes no GPU: selected-gpu-uuid (ConfigMap " + contract.Namespace + "/" + contract.ConfigMapName + ") must name a GPU nvidia-smi lists, and MIG must be off"
	fixDRAClass    = "kubectl apply -k deploy/overlays/dra-node (deploy/components/dra defines DeviceClass " + contract.DRADriver + " with extendedResourceName " + contract.ResourceName + ")"
	fixTwoOwners   = "a node has one owner of " + contract.ResourceName + ": label it " + contract.DRAModeLabel + "=" + contract.DRAModeDRA + " or =" + contract.DRAModeDevicePlugin + " (deploy/overlays/dra-node, Helm mode: by-label) so only one DaemonSet selects it, and drain its GPU pods first"
	fixDRARecover  = "the GPU is Unhealthy (Xid or lost GPU): read the host's dmesg for the Xid; nvinject-dra removes taint " + contract.DRATaintKey + " after --health-quiet-period without a new Xid, or at once on SIGHUP (on a simulated node: POST /debug/sim/recover?uuid=<uuid> on its metrics port); a lost GPU needs a reset or reboot; delete the affected pod to get a healthy device"
	fixDRAStream   = "kubelet's health stream from nvinject-dra lapsed, so device health is Unknown: check nvinject-dra runs (" + draLogs + ") and its metric " + contract.MetricDRAHealthStreams + " is 1"
	fixDRAPrepare  = "kubelet's NodePrepareResources call to nvinject-dra failed; the message names the claim: read " + draLogs + ", correct what it says (missing CDI spec, unknown device), then delete the pod so its controller recreates it"
	fixDRAEndpoint = "kubelet's device manager has no endpoint for the extended resource any more (Kubernetes 1.37 after a switch from the device plugin, dra/README.md): run nvinject-dra with --hold-resource-endpoint (the default) and its --kubelet-dir mounted, then delete the pod"
	fixDRAPodRes   = "nvinject-dra cannot read kubelet's PodResources, so it cannot tell which GPUs device-plugin pods hold and taints every GPU " + contract.DRAHeldTaintKey + "=" + contract.DRAHeldTaintUnknown + " (fail closed): mount kubelet's pod-resources dir (/var/lib/kubelet/pod-resources, as deploy/ does) into its pod and point --pod-resources-socket at the kubelet.sock there; the error is in " + draLogs
	fixDRAStale    = "the claim holds a device the node's ResourceSlice no longer has (GPU deselected or node switched): delete the pod (and its claim) so the scheduler allocates a published device"
)

// kubeletNoEndpoint is kubelet's device manager error for a resource whose
// device-plugin endpoint it dropped.
const kubeletNoEndpoint = "endpoint not found in cache for a registered resource"

// ownerFacts reports the node's mode and flags a second owner of the
// resource: the other daemon on the node, or (DRA) allocatable capacity a
// device plugin still publishes.
func ownerFacts(e evidence.Evidence, f *finding) {
	f.fact("mode %s (%s)", e.Mode.Mode, e.Mode.Source)
	other := e.DRAPod
	if e.Mode.Mode == contract.DRAModeDRA {
		other = e.PluginPod
	}
	if other.Known() && other.Running() {
		f.problem(fixTwoOwners, "%s also runs on %s (%s): two owners of %s", other.App, e.Node, other.Describe(), e.Resource)
	}
}

func checkDRARegistration(e evidence.Evidence) Verdict {
	var f finding
	ownerFacts(e, &f)
	d, m, s, c := e.DRAPod, e.DRA.Metrics, e.DRA.Slices, e.DRA.Class
	if d.Known() {
		f.fact("%s: %s", contract.DRAApp, d.Describe())
	}
	if m.Unread == "" {
		f.fact("%s metrics: registered=%s prepared claims=%s health streams=%s", contract.DRAApp, num(m.Registered), num(m.Prepared), num(m.HealthStreams))
	}
	if s.Unread == "" {
		f.fact("ResourceSlices %v: %s", s.Slices, orNone(sliceDevices(s.Devices)))
	}
	switch {
	case d.Known() && !d.Running():
		f.problem(daemonFix(d), "%s is not running on %s: %s", contract.DRAApp, e.Node, d.Describe())
	case m.Unread == "" && m.Registered != nil && *m.Registered == 0:
		f.problem(fixDRARegister, "kubelet has not accepted %s's registration (%s=0)", contract.DRADriver, contract.MetricDRARegistered)
	case s.Unread == "" && len(s.Slices) == 0:
		f.problem(fixDRASlice, "no ResourceSlice of driver %s for node %s", contract.DRADriver, e.Node)
	case s.Unread == "" && len(s.Devices) == 0:
		f.problem(fixDRANoDevice, "the ResourceSlices of %s on %s list no device", contract.DRADriver, e.Node)
	}
	switch {
	case c.Unread != "":
		f.unread("DeviceClass "+c.Name, c.Unread)
	case !c.Exists:
		f.problem(fixDRAClass, "DeviceClass %s does not exist: no claim can ask for nvinject's GPUs", c.Name)
	case c.ExtendedResourceName != e.Resource:
		f.problem(fixDRAClass, "DeviceClass %s has extendedResourceName %q, want %q: pods asking for %s: 1 stay Pending on this node", c.Name, c.ExtendedResourceName, e.Resource, e.Resource)
	default:
		f.fact("DeviceClass %s serves extended resource %s (KEP-5004)", c.Name, c.ExtendedResourceName)
	}
	migFindings(e, &f)
	if n := e.NodeStatus; n.Unread == "" && n.Allocatable > 0 {
		f.problem(fixTwoOwners, "Node %s still has allocatable %s=%d from a device plugin: the scheduler serves %s requests from it, not through DRA", e.Node, e.Resource, n.Allocatable, e.Resource)
	}
	f.unread(contract.DRAApp+"'s pod", d.Unread)
	f.unread(contract.DRAApp+" metrics "+m.URL, m.Unread)
	f.unread("ResourceSlices", s.Unread)
	return f.verdict("give the doctor the cluster (--kubeconfig, --node-name) and nvinject-dra's metrics (--dra-metrics)")
}

// heldUnknown says whether held taints t say nvinject-dra cannot tell the
// holders.
func heldUnknown(t []string) bool {
	return slices.ContainsFunc(t, func(s string) bool {
		return strings.HasPrefix(s, contract.DRAHeldTaintKey+"="+contract.DRAHeldTaintUnknown+":")
	})
}

func sliceDevices(ds []evidence.SliceDevice) []string {
	out := make([]string, 0, len(ds))
	for _, d := range ds {
		s := fmt.Sprintf("%s %s memory=%s", d.ID(), d.UUID, d.Memory)
		if len(d.Taints) > 0 {
			s += " taints=" + strings.Join(d.Taints, ",")
		}
		out = append(out, s)
	}
	return out
}

func checkDRAHealth(e evidence.Evidence) Verdict {
	var f finding
	m, s := e.DRA.Metrics, e.DRA.Slices
	bad := map[string]bool{}
	for _, d := range s.Devices {
		if t := taints(d, contract.DRATaintKey); len(t) > 0 {
			bad[d.UUID] = true
			f.problem(fixDRARecover, "device %s (%s) is tainted %s: new claims avoid it%s", d.ID(), d.UUID, strings.Join(t, ","), eventsNote(m.HealthEvents))
		}
		if t := taints(d, contract.DRAHeldTaintKey); heldUnknown(t) {
			f.problem(fixDRAPodRes, "device %s (%s) is tainted %s: %s cannot read kubelet's PodResources, so no claim gets it", d.ID(), d.UUID, strings.Join(t, ","), contract.DRAApp)
		} else if len(t) > 0 {
			f.fact("device %s (%s) is tainted %s: a pod given it by the device plugin before the node moved to DRA still runs; new claims get it once that pod ends", d.ID(), d.UUID, strings.Join(t, ","))
		}
	}
	for _, d := range m.Devices {
		switch {
		case !d.Healthy && !bad[d.UUID] && s.Unread == "":
			f.problem(fixDRARecover, "%s reports %s Unhealthy but its ResourceSlice device has no taint yet: the slice update is pending or failed (%s)", contract.DRAApp, d.UUID, draLogs)
		case !d.Healthy && !bad[d.UUID]:
			f.problem(fixDRARecover, "%s reports %s Unhealthy%s", contract.DRAApp, d.UUID, eventsNote(m.HealthEvents))
		default:
			f.fact("%s reports %s healthy=%t", contract.DRAApp, d.UUID, d.Healthy)
		}
	}
	if s.Unread == "" && len(bad) == 0 && len(s.Devices) > 0 {
		f.fact("no device of %v is tainted Unhealthy", s.Slices)
	}
	for _, h := range e.DRA.Claims.Health {
		switch h.Health {
		case "Unhealthy":
			f.problem(fixDRARecover, "%s: %s %s is Unhealthy (status.allocatedResourcesStatus)", h.PodRef, h.Resource, h.ID)
		case "Unknown":
			f.problem(fixDRAStream, "%s: %s %s health is Unknown (status.allocatedResourcesStatus)", h.PodRef, h.Resource, h.ID)
		default:
			f.fact("%s: %s %s %s", h.PodRef, h.Resource, h.ID, h.Health)
		}
	}
	if m.Unread == "" && m.HealthStreams != nil && *m.HealthStreams == 0 && len(e.DRA.Claims.Health) > 0 {
		f.problem(fixDRAStream, "kubelet has no health stream (NodeWatchResources) open to %s", contract.DRAApp)
	}
	if s.Unread != "" && m.Unread != "" {
		f.unread("ResourceSlices", s.Unread)
		f.unread(contract.DRAApp+" metrics "+m.URL, m.Unread)
	}
	f.unread("pods' device health", e.DRA.Claims.Unread)
	return f.verdict("give the doctor the cluster (--kubeconfig, --node-name) or nvinject-dra's metrics (--dra-metrics)")
}

// draPending are the scheduler's messages that mean no device could be
// allocated on the node.
var draPending = []string{"cannot allocate all claims", "cannot fit resource", "cannot schedule extended resource claim", "resourceclaim not available", "device class"}

func checkDRAScheduling(e evidence.Evidence) Verdict {
	var f finding
	l, cl, s := e.Ledger, e.DRA.Claims, e.DRA.Slices
	if l.Unread != "" || cl.Unread != "" {
		f.unread("pods and scheduler events", l.Unread)
		f.unread("ResourceClaims", cl.Unread)
		return f.verdict("give the doctor the cluster (--kubeconfig, --node-name)")
	}
	var holders []string
	held := map[string]bool{}
	for _, c := range cl.Claims {
		for _, d := range c.Devices {
			held[d.ID()] = true
			holders = append(holders, fmt.Sprintf("%s (%s, reserved for %s)", c, d.ID(), orNone(c.ReservedFor)))
		}
	}
	free, tainted, dpHeld, unknown := 0, 0, 0, 0
	for _, d := range s.Devices {
		switch {
		case len(taints(d, contract.DRATaintKey)) > 0:
			tainted++
		case heldUnknown(taints(d, contract.DRAHeldTaintKey)):
			unknown++
		case len(taints(d, contract.DRAHeldTaintKey)) > 0:
			dpHeld++
		case !held[d.ID()]:
			free++
		}
	}
	f.fact("ledger on %s: %d of %d published device(s) allocated, %d tainted Unhealthy, %d held by device-plugin pods, %d with holders unknown, %d free; claims: %s", e.Node, len(held), len(s.Devices), tainted, dpHeld, unknown, free, orNone(holders))
	for _, p := range l.Pending {
		if !strings.Contains(p.Message, "Insufficient "+e.Resource) && !slices.ContainsFunc(draPending, func(m string) bool { return strings.Contains(p.Message, m) }) {
			continue
		}
		fix := "a device is free: the claim's selectors (CEL) or the pod's node constraints match none of " + e.Node + "'s devices: kubectl describe pod " + p.Name + " and kubectl get resourceslices -o yaml"
		switch {
		case s.Unread == "" && len(s.Devices) == 0:
			fix = "the node publishes no device: fix the registration layer first"
		case strings.Contains(p.Message, "device class"):
			fix = fixDRAClass
		case s.Unread == "" && free == 0 && unknown > 0:
			fix = fixDRAPodRes
		case s.Unread == "" && free == 0 && dpHeld > 0:
			fix = "a pod given the GPU by the device plugin before the node moved to DRA still holds it (taint " + contract.DRAHeldTaintKey + "): the pod gets it once that pod ends; delete that pod (its node's GPU pods: kubectl get pods -A --field-selector spec.nodeName=" + e.Node + ") to move it now"
		case s.Unread == "" && free == 0 && tainted > 0 && len(held) < len(s.Devices):
			fix = "the free GPU is tainted Unhealthy: fix the health layer first"
		case s.Unread == "" && free == 0:
			fix = "every GPU on the node is allocated: free one (delete or scale down the pods holding " + orNone(holders) + ") or add a GPU node"
		}
		f.problem(fix, "pod %s Pending: %s", p.PodRef, p.Message)
	}
	return f.verdict("")
}

func checkDRAAllocate(e evidence.Evidence) Verdict {
	var f finding
	m, cl, s := e.DRA.Metrics, e.DRA.Claims, e.DRA.Slices
	if m.Unread == "" {
		f.fact("%s counted %s failed NodePrepareResources claims; prepared claims now %s", contract.DRAApp, num(m.PrepareErrors), num(m.Prepared))
	}
	if cl.Unread != "" || e.Allocate.Unread != "" {
		f.unread("ResourceClaims", cl.Unread)
		f.unread("pods and kubelet events", e.Allocate.Unread)
		return f.verdict("give the doctor the cluster (--kubeconfig, --node-name)")
	}
	uuid := map[string]string{}
	for _, d := range s.Devices {
		uuid[d.ID()] = d.UUID
	}
	for _, c := range cl.Claims {
		how := "ResourceClaim"
		if c.Extended {
			how = "the scheduler's claim for " + e.Resource + " (KEP-5004)"
		}
		switch {
		case !c.Allocated:
			f.problem("the scheduler has not allocated the claim though its pod is on the node: kubectl describe resourceclaim -n "+c.Namespace+" "+c.Name, "claim %s (%s) used by %v is not allocated", c, how, c.Pods)
			continue
		case len(c.Devices) == 0:
			f.fact("claim %s used by %v holds no %s device", c, c.Pods, contract.DRADriver)
			continue
		}
		for _, d := range c.Devices {
			u, ok := uuid[d.ID()]
			if s.Unread == "" && !ok {
				f.problem(fixDRAStale, "claim %s holds %s/%s, which no ResourceSlice of %s lists", c, d.Driver, d.ID(), e.Node)
				continue
			}
			f.fact("claim %s (%s) allocated by the scheduler: request %s → %s/%s %s%s, reserved for %s", c, how, d.Request, d.Driver, d.ID(), u, shareNote(d), orNone(c.ReservedFor))
		}
	}
	for _, line := range sharesPerGPU(s, cl) {
		f.fact("%s", line)
	}
	for _, p := range e.Allocate.PrepareFailures {
		f.problem(fixDRAPrepare, "pod %s: %s", p.PodRef, p.Message)
	}
	if e.NRI.ErrorsUnread == "" {
		for _, c := range e.NRI.CreateErrors {
			if strings.Contains(c.Message, kubeletNoEndpoint) {
				f.problem(fixDRAEndpoint, "%s %s: %s", c.PodRef, c.Reason, c.Message)
			}
		}
	}
	if len(cl.Claims) == 0 {
		f.fact("no claim on %s holds a %s device", e.Node, contract.DRADriver)
	}
	if len(e.Allocate.PrepareFailures) == 0 {
		f.fact("kubelet reported no FailedPrepareDynamicResources on %s", e.Node)
	}
	return f.verdict("")
}

// shareNote says what a claim's device is beyond the device: a share and
// what it consumes, or admin access.
func shareNote(d evidence.ClaimDevice) string {
	var out string
	if d.ShareID != "" {
		out = " share " + d.ShareID + " " + orNone(d.Consumed)
	}
	if d.AdminAccess {
		out += " with admin access"
	}
	return out
}

// sharesPerGPU is one line per GPU in shares (consumable capacity): the
// GPU, its share device's capacity and each claim's share.
func sharesPerGPU(s evidence.SliceEvidence, cl evidence.ClaimsEvidence) []string {
	var out []string
	for _, d := range s.Devices {
		if d.Type != contract.DRATypeShare {
			continue
		}
		var shares []string
		for _, c := range cl.Claims {
			for _, cd := range c.Devices {
				if cd.ID() == d.ID() && !cd.AdminAccess {
					shares = append(shares, c.String()+" "+orNone(cd.Consumed))
				}
			}
		}
		out = append(out, fmt.Sprintf("GPU %s in shares (%s, memory %s): %d share(s): %s", d.UUID, d.ID(), d.Memory, len(shares), orNone(shares)))
	}
	return out
}

// taints are d's taints with key.
func taints(d evidence.SliceDevice, key string) []string {
	var out []string
	for _, t := range d.Taints {
		if strings.HasPrefix(t, key+"=") {
			out = append(out, t)
		}
	}
	return out
}
