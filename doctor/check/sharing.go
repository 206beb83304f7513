package check

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// The sharing rows belong to the device plugin's allocate layer (a DRA
// claim is shared only among its own pods, which nvinject-nri checks by
// claim): they judge what kubelet handed out (PodResources) and the MPS
// daemon the device plugin runs for what it handed out, after scheduling placed the pods and before
// injection gives their containers the device (and an MPS pipe dir no
// daemon serves).

const (
	fixOverShared = "the sharing config's replicas were lowered under running pods (the CDI spec records the new count, the pods kept their old replicas), or a pod got the GPU around nvinject-nri's check: delete the pods over the count, newest first (kubectl get pods -A --field-selector spec.nodeName=<node> --sort-by=.metadata.creationTimestamp), or restore replicas in ConfigMap " + contract.Namespace + "/nvinject-sharing (config.yaml) and roll the device plugin (kubectl -n " + contract.Namespace + " rollout restart ds/" + contract.DevicePluginApp + ")"
	fixExclusive  = "a GPU that is not shared is held by several pods: its sharing was removed under running pods, or a pod got it around nvinject-nri's check; delete all but one of them, newest first (kubectl get pods -A --field-selector spec.nodeName=<node> --sort-by=.metadata.creationTimestamp)"
	fixMPS        = "nvinject-device-plugin runs an MPS control daemon per shared GPU and restarts it when it exits: read its log (" + pluginLogs + ", and the daemon's log dir beside the pipe dir); if the socket does not come back, restart the device plugin's pod (kubectl -n " + contract.Namespace + " delete pod -l " + contract.AppLabel + "=" + contract.DevicePluginApp + " --field-selector spec.nodeName=<node>)"
)

// sharingFindings judges each GPU and MIG device's holders against its
// replicas, and the MPS daemons shared devices name.
func sharingFindings(e evidence.Evidence, f *finding) {
	mpsFindings(e.CDI, f)
	p, c := e.PodResources, e.CDI
	shared := slices.ContainsFunc(c.GPUDevices, func(d evidence.CDIDevice) bool { return d.Replicas > 1 })
	switch {
	case p.Unread != "" && shared:
		f.unread("kubelet's PodResources (who holds the shared GPUs)", p.Unread)
		return
	case p.Unread != "":
		f.fact("who holds which GPU not read (kubelet's PodResources: %s)", p.Unread)
		return
	case c.Unread != "":
		// Without the spec neither replicas nor index IDs are known.
		return
	}
	holders := deviceHolders(e)
	for _, d := range c.GPUDevices {
		pods := holders[d.UUID]
		n := max(d.Replicas, 1)
		if len(pods) <= n {
			continue
		}
		if d.Replicas > 1 {
			f.problem(fixOverShared, "shared %s %s (%s %d) is held by %d pods at once: %s", unitKind(d), d.UUID, contract.SharedReplicasAnnotation, d.Replicas, len(pods), strings.Join(pods, ", "))
		} else {
			f.problem(fixExclusive, "%s %s is not shared (no %s) but %d pods hold it at once: %s", unitKind(d), d.UUID, contract.SharedReplicasAnnotation, len(pods), strings.Join(pods, ", "))
		}
	}
}

// deviceHolders maps each CDI device's UUID to the pods kubelet assigned
// it to, sorted: device IDs are its names (UUID, or index), a replica's
// with "::<n>" after; resources of other domains are another vendor's.
func deviceHolders(e evidence.Evidence) map[string][]string {
	byName := map[string]string{}
	for _, d := range e.CDI.GPUDevices {
		for _, n := range d.Names {
			byName[n] = d.UUID
		}
	}
	domain, _, _ := strings.Cut(e.Resource, "/")
	sets := map[string]map[string]bool{}
	for _, c := range e.PodResources.Containers {
		if !strings.HasPrefix(c.Resource, domain+"/") {
			continue
		}
		for _, id := range c.IDs {
			id, _, _ = strings.Cut(id, "::")
			uuid, ok := byName[id]
			if !ok {
				continue
			}
			if sets[uuid] == nil {
				sets[uuid] = map[string]bool{}
			}
			sets[uuid][c.Namespace+"/"+c.Name] = true
		}
	}
	out := map[string][]string{}
	for uuid, pods := range sets {
		out[uuid] = slices.Sorted(maps.Keys(pods))
	}
	return out
}

func unitKind(d evidence.CDIDevice) string {
	if d.Parent != "" {
		return fmt.Sprintf("MIG device (%s on %s)", d.Profile, d.Parent)
	}
	return "GPU"
}

// mpsFindings names each shared device whose MPS control daemon is down.
func mpsFindings(c evidence.CDIEvidence, f *finding) {
	for _, d := range c.GPUDevices {
		m := d.MPS
		switch {
		case m == nil:
		case m.Down != "":
			f.problem(fixMPS, "the MPS control daemon of %s %s is down: its control socket %s/control takes no connection (%s), so the containers sharing it cannot start CUDA", unitKind(d), d.UUID, m.PipeDir, m.Down)
		case m.Unread != "":
			f.unread(fmt.Sprintf("the MPS control daemon of %s (%s)", d.UUID, m.PipeDir), m.Unread)
		default:
			f.fact("MPS control daemon of %s up (%s/control)", d.UUID, m.PipeDir)
		}
	}
}
