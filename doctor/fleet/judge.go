package fleet

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// Layers of a row, judged in this order: a later one depends on the
// earlier ones, so the first broken one is where to start.
const (
	// LayerNode: the Node is Ready and not left cordoned by a failed nvinject-move.
	LayerNode = "node"
	// LayerOwner: the mode's daemon has a Ready pod on the node and the other path's has none.
	LayerOwner = "owner"
	// LayerNRI: nvinject-nri has a Ready pod on the node.
	LayerNRI = "nri"
	// LayerPublished: the owner publishes at least one GPU.
	LayerPublished = "published"
	// LayerHealth: every published GPU is healthy.
	LayerHealth = "health"
	// LayerDriver: the node's label and ResourceSlices report one driver version.
	LayerDriver = "driver"
)

// resourceDomain prefixes the extended resources the device plugin
// publishes GPUs as: nvidia.com/gpu, nvidia.com/mig-<profile>, or another
// --resource-name.
const resourceDomain = "nvidia.com/"

// metricsPortName is the daemons' container port serving /readyz in
// deploy/'s DaemonSets; a pod without it is probed on its app's default.
const metricsPortName = "metrics"

// defaultPorts are the daemons' default metrics ports, by app label.
var defaultPorts = map[string]int{
	contract.DevicePluginApp: contract.DevicePluginMetricsPort,
	contract.DRAApp:          contract.DRAMetricsPort,
	contract.NRIApp:          contract.NRIMetricsPort,
}

// facts is what the API says about one node.
type facts struct {
	node      *corev1.Node
	slices    []resourceapi.ResourceSlice
	pods      map[string]*corev1.Pod // by app label
	namespace string
}

// gpuNode says whether the node has GPUs: the label deploy/ selects by, an
// nvidia.com/ resource in its capacity, or the DRA driver's slices.
func (f facts) gpuNode() bool {
	if f.node.Labels[contract.GFDLabelPresent] == "true" || len(f.slices) > 0 {
		return true
	}
	for name := range f.node.Status.Capacity {
		if strings.HasPrefix(string(name), resourceDomain) {
			return true
		}
	}
	return false
}

// probe asks a not-Ready daemon pod for its readyz reason.
type probe struct {
	row            int
	namespace, pod string
	port           int
	// reason is the row's reason before the pod's state.
	reason string
}

// broken is a row's first broken layer.
type broken struct {
	layer, reason, fix string
	probe              *probe
}

// view is a node's facts and what the row shows of them.
type view struct {
	facts
	mode               string
	published, healthy int64
	versions           []source
}

// source is one place that reports the node's driver version.
type source struct{ where, version string }

// judge makes the node's row, and the probe that would explain a
// not-Ready daemon when that is its first broken layer.
func judge(f facts) (Row, *probe) {
	v := view{facts: f, mode: cmp.Or(f.node.Labels[contract.DRAModeLabel], contract.DRAModeDevicePlugin)}
	devs := f.devices()
	if v.mode == contract.DRAModeDRA {
		v.published = int64(len(devs))
		for _, d := range devs {
			if !tainted(d.Device) {
				v.healthy++
			}
		}
	} else {
		v.published, v.healthy = f.resources()
	}
	v.versions = f.driverVersions(devs)
	r := Row{Node: f.node.Name, Mode: v.mode, Model: f.model(devs), Published: v.published, Healthy: v.healthy,
		Driver: strings.Join(distinct(v.versions), ","), Status: StatusOK}
	for _, check := range []func(view) *broken{checkNode, checkOwner, checkNRI, checkPublished, checkHealth, checkDriver} {
		if b := check(v); b != nil {
			r.Status, r.Layer, r.Reason, r.Fix = StatusBroken, b.layer, b.reason, b.fix
			return r, b.probe
		}
	}
	return r, nil
}

func checkNode(v view) *broken {
	n := v.node.Name
	if ok, why := nodeReady(v.node); !ok {
		return &broken{layer: LayerNode, reason: "NotReady: " + why,
			fix: fmt.Sprintf("kubelet on %s does not report Ready: kubectl describe node %s, then kubelet's and containerd's logs on the node", n, n)}
	}
	if why, ok := v.node.Annotations[contract.MoveFailedAnnotation]; ok && v.node.Spec.Unschedulable {
		return &broken{layer: LayerNode, reason: "cordoned by a failed nvinject-move: " + firstLine(why),
			fix: fmt.Sprintf("fix what the reason says, then run nvinject-move for %s again (a success uncordons it and clears %s); or kubectl uncordon %s && kubectl annotate node %s %s-",
				n, contract.MoveFailedAnnotation, n, n, contract.MoveFailedAnnotation)}
	}
	return nil
}

func checkOwner(v view) *broken {
	owner, other := contract.DevicePluginApp, contract.DRAApp
	switch v.mode {
	case contract.DRAModeDRA:
		owner, other = other, owner
	case contract.DRAModeDevicePlugin:
	default:
		return &broken{layer: LayerOwner, reason: fmt.Sprintf("label %s=%q names no owner", contract.DRAModeLabel, v.mode),
			fix: fmt.Sprintf("kubectl label node %s --overwrite %s=%s (or %s)", v.node.Name, contract.DRAModeLabel, contract.DRAModeDevicePlugin, contract.DRAModeDRA)}
	}
	if b := v.daemon(LayerOwner, owner); b != nil {
		return b
	}
	if p := v.pods[other]; p != nil {
		return &broken{layer: LayerOwner, reason: fmt.Sprintf("%s pod %s runs on this %s node too: two owners of its GPUs", other, p.Name, v.mode),
			fix: fmt.Sprintf("finish the move: nvinject-move move %s --to=%s (it waits until %s is gone), or compare the DaemonSets' nodeSelectors with the node's %s label",
				v.node.Name, v.mode, other, contract.DRAModeLabel)}
	}
	return nil
}

func checkNRI(v view) *broken { return v.daemon(LayerNRI, contract.NRIApp) }

// daemon judges app's pod on the node: present and Ready.
func (v view) daemon(layer, app string) *broken {
	p := v.pods[app]
	if p == nil {
		return &broken{layer: layer, reason: fmt.Sprintf("no %s pod on the node", app),
			fix: fmt.Sprintf("kubectl -n %s get ds %s -o wide, and compare its nodeSelector with the node's labels (%s=true, %s)", v.namespace, app, contract.GFDLabelPresent, contract.DRAModeLabel)}
	}
	if podReady(p) {
		return nil
	}
	reason := fmt.Sprintf("%s pod %s not Ready", app, p.Name)
	return &broken{layer: layer, reason: reason + ": " + podState(p),
		fix:   fmt.Sprintf("kubectl -n %s logs %s; %s walks the node's layers", v.namespace, p.Name, deepDoctor(v.node.Name)),
		probe: &probe{namespace: p.Namespace, pod: p.Name, port: metricsPort(p, app), reason: reason}}
}

// deepDoctor is the command that walks node's layers in depth.
func deepDoctor(node string) string {
	return "nvinject-doctor --node-name " + node + " (with --remote off the node)"
}

func checkPublished(v view) *broken {
	if v.published > 0 {
		return nil
	}
	what := "Node capacity has no " + resourceDomain + " resource"
	if v.mode == contract.DRAModeDRA {
		what = "no device in " + contract.DRADriver + "'s ResourceSlices for the node"
	}
	return &broken{layer: LayerPublished, reason: "no GPU published: " + what,
		fix: deepDoctor(v.node.Name) + ": its driver and registration layers say why"}
}

func checkHealth(v view) *broken {
	if v.healthy >= v.published {
		return nil
	}
	how := "allocatable below capacity"
	if v.mode == contract.DRAModeDRA {
		how = "devices with a NoSchedule or NoExecute taint"
	}
	return &broken{layer: LayerHealth, reason: fmt.Sprintf("%d of %d GPUs unhealthy (%s)", v.published-v.healthy, v.published, how),
		fix: deepDoctor(v.node.Name) + ": its health layer names the GPU and why (Xid, lost, a pod of the other path holding it)"}
}

func checkDriver(v view) *broken {
	if len(v.versions) < 2 {
		return nil
	}
	first := v.versions[0]
	for _, s := range v.versions[1:] {
		if normVersion(s.version) != normVersion(first.version) {
			return &broken{layer: LayerDriver, reason: fmt.Sprintf("%s says %s, %s says %s", first.where, first.version, s.where, s.version),
				fix: fmt.Sprintf("a driver upgrade is half done, or the owner has not republished since: finish it with nvinject-move upgrade %s --driver-version=..., or restart the owner's pod on %s so it republishes", v.node.Name, v.node.Name)}
		}
	}
	return nil
}

// device is a ResourceSlice device and the slice it is in.
type device struct {
	slice string
	resourceapi.Device
}

// devices are the devices of each pool's current generation: a slice of
// an older one is on its way out.
func (f facts) devices() []device {
	gen := map[string]int64{}
	for _, s := range f.slices {
		gen[s.Spec.Pool.Name] = max(gen[s.Spec.Pool.Name], s.Spec.Pool.Generation)
	}
	var out []device
	for _, s := range f.slices {
		if s.Spec.Pool.Generation != gen[s.Spec.Pool.Name] {
			continue
		}
		for _, d := range s.Spec.Devices {
			out = append(out, device{slice: s.Name, Device: d})
		}
	}
	return out
}

// resources are the node's nvidia.com/ capacity and allocatable.
func (f facts) resources() (capacity, allocatable int64) {
	for name, q := range f.node.Status.Capacity {
		if strings.HasPrefix(string(name), resourceDomain) {
			capacity += q.Value()
			if a, ok := f.node.Status.Allocatable[name]; ok {
				allocatable += a.Value()
			}
		}
	}
	return capacity, allocatable
}

// tainted says whether a taint keeps new claims off the device.
func tainted(d resourceapi.Device) bool {
	return slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool {
		return t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute
	})
}

func (f facts) model(devs []device) string {
	if m := f.node.Labels[contract.GFDLabelProduct]; m != "" {
		return m
	}
	var names []string
	for _, d := range devs {
		if a, ok := d.Attributes[contract.DRAAttrProductName]; ok && a.StringValue != nil && !slices.Contains(names, *a.StringValue) {
			names = append(names, *a.StringValue)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

// driverVersions are the node's driver version sources: its GFD label,
// then each slice device's driverVersion attribute.
func (f facts) driverVersions(devs []device) []source {
	var out []source
	if v := f.node.Labels[contract.GFDLabelDriverVersion]; v != "" {
		out = append(out, source{"label " + contract.GFDLabelDriverVersion, v})
	}
	for _, d := range devs {
		a := d.Attributes[contract.DRAAttrDriverVersion]
		if v := cmp.Or(a.VersionValue, a.StringValue); v != nil {
			out = append(out, source{fmt.Sprintf("ResourceSlice %s device %s", d.slice, d.Name), *v})
		}
	}
	return out
}

// distinct are the versions that differ, each as its first source wrote it.
func distinct(sources []source) []string {
	var out, seen []string
	for _, s := range sources {
		if n := normVersion(s.version); !slices.Contains(seen, n) {
			seen, out = append(seen, n), append(out, s.version)
		}
	}
	return out
}

// normVersion compares NVIDIA's dotted versions ("535.261.03", the label)
// with the slices' semantic ones ("535.261.3"): leading zeros go, and
// missing parts are 0.
func normVersion(v string) string {
	parts := strings.Split(v, ".")
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		if n, err := strconv.ParseUint(p, 10, 64); err == nil {
			parts[i] = strconv.FormatUint(n, 10)
		}
	}
	return strings.Join(parts, ".")
}

func nodeReady(n *corev1.Node) (bool, string) {
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			return true, ""
		}
		why := "Ready=" + string(c.Status)
		if c.Reason != "" {
			why += " " + c.Reason
		}
		if c.Message != "" {
			why += ": " + c.Message
		}
		return false, firstLine(why)
	}
	return false, "no Ready condition: kubelet has not reported"
}

func podReady(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// podState is why kubelet says a pod is not ready, in its words: a
// container's waiting or terminated reason, else the phase.
func podState(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		switch s := cs.State; {
		case s.Waiting != nil:
			return firstLine(strings.TrimSuffix(s.Waiting.Reason+": "+s.Waiting.Message, ": "))
		case s.Terminated != nil:
			return firstLine(fmt.Sprintf("%s (exit code %d)", s.Terminated.Reason, s.Terminated.ExitCode))
		case !cs.Ready:
			return fmt.Sprintf("%s, container %s running, not ready", p.Status.Phase, cs.Name)
		}
	}
	return "phase " + cmp.Or(string(p.Status.Phase), "unknown")
}

// metricsPort is the port pod serves /readyz on.
func metricsPort(p *corev1.Pod, app string) int {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == metricsPortName {
				return int(port.ContainerPort)
			}
		}
	}
	return defaultPorts[app]
}
