package check

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// The MIG rows belong to the registration layer: they ask whether what the
// node publishes (its CDI spec, Node capacity, ResourceSlices) is the
// driver's MIG layout. That comes before scheduling onto it, and a stale
// layout is what later makes a pod's CDI name resolve to nothing
// (cdi-runtime), so the first broken layer names the cause.
//
// A mismatch is broken, not a warning while young: nvinject republishes a
// changed layout within --mig-rescan-interval (10s), so one the doctor
// sees has almost always outlived it, and the fix says to run it again.

// MIG strategies, gpuselect.MIGStrategy's values (check imports no
// package that could do I/O).
const (
	migNone   = "none"
	migSingle = "single"
	migMixed  = "mixed"
	// migEnabled is nvidia-smi's mig.mode.current of a GPU with MIG on.
	migEnabled = "Enabled"
)

// migDaemon is the daemon that publishes the node's MIG devices.
func migDaemon(e evidence.Evidence) evidence.DaemonEvidence {
	d := e.PluginPod
	if e.Mode.Mode == contract.DRAModeDRA {
		d = e.DRAPod
	}
	if d.App == "" {
		d.App, d.Namespace = contract.DevicePluginApp, contract.Namespace
		if e.Mode.Mode == contract.DRAModeDRA {
			d.App = contract.DRAApp
		}
	}
	return d
}

func fixMIGLayout(d evidence.DaemonEvidence) string {
	pod := d.Pod
	if pod == "" {
		pod = "-l " + contract.AppLabel + "=" + d.App + " --field-selector spec.nodeName=<node>"
	}
	return fmt.Sprintf("nvinject republishes a changed MIG layout within --mig-rescan-interval (default 10s): run the doctor again; if it persists, read %s's log (kubectl -n %s logs ds/%s --tail=100) and restart its pod (kubectl -n %s delete pod %s)", d.App, d.Namespace, d.App, d.Namespace, pod)
}

func fixMIGNone(d evidence.DaemonEvidence, g evidence.GPU) string {
	manifest := "deploy/base/device-plugin-daemonset.yaml; Helm value migStrategy"
	if d.App == contract.DRAApp {
		manifest = "deploy/components/dra/dra-daemonset.yaml"
	}
	return fmt.Sprintf("set MIG_STRATEGY=single or mixed on %s (env MIG_STRATEGY in its DaemonSet, %s) and roll it (kubectl -n %s rollout restart ds/%s), or turn MIG off on GPU %s (nvidia-smi -i %s -mig 0, then reset it) to publish it whole", d.App, manifest, d.Namespace, d.App, g.Index, g.Index)
}

// selected says whether the plugin's selection holds GPU uuid, and whether
// the selection was read.
func selected(e evidence.Evidence, uuid string) (in, known bool) {
	s := e.Selected
	return s.Unread == "" && (s.All || slices.Contains(s.UUIDs, uuid)), s.Unread == ""
}

// migFindings judges the live MIG layout against what the node publishes.
// Without nvidia-smi's GPU list there is nothing to judge (the driver layer
// says why).
func migFindings(e evidence.Evidence, f *finding) {
	s := e.SMI
	if s.Unread != "" || s.Failed != "" {
		return
	}
	d := migDaemon(e)
	var migGPUs []evidence.GPU
	for _, g := range s.GPUs {
		if g.MIGMode == migEnabled {
			migGPUs = append(migGPUs, g)
		}
	}
	if len(migGPUs) == 0 {
		return
	}
	if d.MIGStrategy == migNone {
		for _, g := range migGPUs {
			if in, _ := selected(e, g.UUID); in {
				f.problem(fixMIGNone(d, g), "GPU %s (%s) has MIG mode on but %s runs MIG_STRATEGY=none: it publishes whole GPUs only, so neither this GPU nor its MIG devices are published", g.Index, g.UUID, d.App)
			}
		}
		return
	}
	if s.MIGUnread != "" {
		f.unread("the MIG devices (nvidia-smi -L)", s.MIGUnread)
		return
	}
	// live are the MIG devices the daemon should publish: those of
	// selected GPUs; gone are published ones on no GPU's list.
	var live []evidence.MIGDevice
	sel := true
	for _, m := range s.MIGDevices {
		in, known := selected(e, m.Parent)
		sel = sel && known
		if in {
			live = append(live, m)
		}
	}
	f.fact("nvidia-smi -L: %d MIG device(s) live: %s", len(s.MIGDevices), orNone(migNames(s.MIGDevices)))
	isLive := func(uuid string) bool {
		return slices.ContainsFunc(s.MIGDevices, func(m evidence.MIGDevice) bool { return m.UUID == uuid })
	}
	fix := fixMIGLayout(d)
	if c := e.CDI; c.Unread == "" {
		var inSpec []string
		for _, g := range c.GPUDevices {
			if g.Parent != "" {
				inSpec = append(inSpec, g.UUID)
			}
		}
		if missing := absent(live, inSpec); sel && len(missing) > 0 {
			f.problem(fix, "MIG device(s) live in the driver (nvidia-smi -L) but not in the node's CDI spec: %s", strings.Join(migNames(missing), ", "))
		}
		if gone := filter(inSpec, func(u string) bool { return !isLive(u) }); len(gone) > 0 {
			f.problem(fix, "MIG device(s) in the node's CDI spec but gone from the driver (not in nvidia-smi -L): %s", strings.Join(gone, ", "))
		}
	}
	if e.Mode.Mode == contract.DRAModeDRA && e.DRA != nil {
		migSlices(e.DRA.Slices, live, sel, isLive, fix, f)
		return
	}
	if e.NodeStatus.Unread == "" && e.CDI.Unread == "" && sel {
		migCapacity(e, d.MIGStrategy, live, fix, f)
	}
}

// migSlices judges nvinject-dra's ResourceSlice MIG devices.
func migSlices(sl evidence.SliceEvidence, live []evidence.MIGDevice, sel bool, isLive func(string) bool, fix string, f *finding) {
	if sl.Unread != "" {
		return
	}
	var published []string
	var gone []string
	for _, d := range sl.Devices {
		if d.Type != contract.DRATypeMIG || d.UUID == "" {
			continue
		}
		published = append(published, d.UUID)
		if !isLive(d.UUID) {
			gone = append(gone, fmt.Sprintf("%s (%s)", d.UUID, d.ID()))
		}
	}
	if missing := absent(live, published); sel && len(missing) > 0 {
		f.problem(fix, "MIG device(s) live in the driver (nvidia-smi -L) but in no ResourceSlice of %s: %s", contract.DRADriver, strings.Join(migNames(missing), ", "))
	}
	if len(gone) > 0 {
		f.problem(fix, "MIG device(s) in a ResourceSlice of %s but gone from the driver (not in nvidia-smi -L): %s", contract.DRADriver, strings.Join(gone, ", "))
	}
}

// migCapacity judges the device plugin's MIG resources in Node capacity,
// which count devices (times their replicas when shared, from the CDI
// spec): one nvidia.com/mig-<profile> per profile under mixed, all of them
// as the GPU resource under single.
func migCapacity(e evidence.Evidence, strategy string, live []evidence.MIGDevice, fix string, f *finding) {
	replicas := func(uuid string) int64 {
		for _, c := range e.CDI.GPUDevices {
			if c.UUID == uuid && c.Replicas > 1 {
				return int64(c.Replicas)
			}
		}
		return 1
	}
	n := e.NodeStatus
	switch strategy {
	case migSingle:
		if slices.ContainsFunc(e.SMI.GPUs, func(g evidence.GPU) bool { in, _ := selected(e, g.UUID); return in && g.MIGMode != migEnabled }) {
			break
		}
		var want int64
		for _, m := range live {
			want += replicas(m.UUID)
		}
		if n.Capacity != want {
			f.problem(fix, "Node %s capacity %s=%d but the driver has %d MIG device(s) to publish under MIG_STRATEGY=single: %s", e.Node, e.Resource, n.Capacity, want, orNone(migNames(live)))
		}
	case migMixed:
		want, devs := map[string]int64{}, map[string][]evidence.MIGDevice{}
		for _, m := range live {
			r := contract.MIGResourceName(e.Resource, m.Profile)
			want[r] += replicas(m.UUID)
			devs[r] = append(devs[r], m)
		}
		// renameByDefault publishes a shared resource as <name>.shared.
		got, all := map[string]int64{}, maps.Clone(want)
		for r, v := range n.MIGCapacity {
			r = strings.TrimSuffix(r, ".shared")
			got[r] += v
			all[r] += 0
		}
		for _, r := range slices.Sorted(maps.Keys(all)) {
			if got[r] != want[r] {
				f.problem(fix, "Node %s capacity %s=%d but the driver has %d to publish under MIG_STRATEGY=mixed: %s", e.Node, r, got[r], want[r], orNone(migNames(devs[r])))
			}
		}
	}
}

// absent are the devices of live whose UUID is not in published.
func absent(live []evidence.MIGDevice, published []string) []evidence.MIGDevice {
	var out []evidence.MIGDevice
	for _, m := range live {
		if !slices.Contains(published, m.UUID) {
			out = append(out, m)
		}
	}
	return out
}

func filter(s []string, keep func(string) bool) []string {
	var out []string
	for _, v := range s {
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}

// migNames names each MIG device with its profile and parent.
func migNames(ms []evidence.MIGDevice) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = fmt.Sprintf("%s (%s on %s)", m.UUID, m.Profile, m.Parent)
	}
	return out
}
