package check

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// The injection layer's fixes. containerd's default validator refuses every
// pod whose annotation contract.RequiredPluginsAnnotation names the plugin
// while the plugin is not connected (deploy/containerd/README.md), so an
// nvinject-nri that does not run stops every GPU pod on the node.
const (
	nriLogs = "kubectl -n " + contract.Namespace + " logs ds/" + contract.NRIApp + " --tail=100"
	fixNRI  = "nvinject-nri runs but is not connected to containerd's NRI: read " + nriLogs + " for the dial error; check containerd's NRI is enabled ([plugins.'" + contract.ContainerdNRI + "'] disable = false) and that the socket it serves (socket_path, default /var/run/nri/nri.sock) is in the dir the pod mounts (volume nri-socket)"
	// The plugin's name is what the refusal quotes; the pods' annotation
	// and nvinject-nri's --plugin-name must agree on it.
	fixRefusedConnected = "containerd found no NRI plugin named " + contract.NRIPluginName + " when it created the container: check nvinject-nri's --plugin-name (Helm value nri.pluginName) is the name the pod's annotation " + contract.RequiredPluginsAnnotation + " lists; kubelet retries the container by itself once they agree"
	fixRefusedApp       = "fix the injection layer (nvinject-nri) first: kubelet retries the refused container by itself once nvinject-nri is connected"
)

// nriVolumeFixes say what each of nvinject-nri's hostPath volumes
// (deploy/base/nri-daemonset.yaml, deploy/helm/nvinject/templates/nri-daemonset.yaml)
// must point at. The chart has no value for these paths yet.
var nriVolumeFixes = map[string]string{
	"nri-socket":    "your node's NRI socket dir, e.g. the dir of containerd's [plugins.'" + contract.ContainerdNRI + "'] socket_path (containerd creates it only with NRI enabled); the mountPath /var/run/nri and --socket-path stay",
	"pod-resources": "kubelet's pod-resources dir (<kubelet --root-dir>/pod-resources)",
}

// mountVolume finds the volume kubelet names in a FailedMount event.
var mountVolume = regexp.MustCompile(`for volume "([^"]+)"`)

// requiredPluginRefusal says whether msg is containerd's default validator
// refusing a container because a required NRI plugin is not connected
// (containerd/nri plugins/default-validator: "required plugin %q not present").
func requiredPluginRefusal(msg string) bool {
	return strings.Contains(msg, "required plugin") && strings.Contains(msg, `"`+contract.NRIPluginName) && strings.Contains(msg, "not present")
}

func checkInjection(e evidence.Evidence) Verdict {
	var f finding
	d, n := e.NRIPod, e.NRI
	// A pod that does not run is described in its problem below.
	if d.Running() {
		f.fact("%s: %s", contract.NRIApp, d.Describe())
	}
	if n.MetricsUnread == "" {
		f.fact("%s metrics %s: %s=%s", contract.NRIApp, n.URL, contract.MetricNRIConnected, num(n.Connected))
	}
	switch {
	case d.Known() && d.Pod == "":
		f.problem(daemonFix(d), "no %s pod on %s, so containerd refuses every GPU pod there (fail-closed): %s", contract.NRIApp, e.Node, d.Describe())
	case d.Known() && !d.Running():
		f.problem(nriStartFix(d), "%s is not running on %s, so containerd refuses every GPU pod there (fail-closed): %s", contract.NRIApp, e.Node, d.Describe())
	case n.MetricsUnread != "":
		f.unread(contract.NRIApp+" metrics "+n.URL, n.MetricsUnread)
	case n.Connected == nil:
		f.unread(contract.NRIApp+" metrics "+n.URL, contract.MetricNRIConnected+" is absent")
	case *n.Connected == 0:
		f.problem(fixNRI, "%s is not connected to containerd (%s 0), so containerd refuses every GPU pod on %s (fail-closed)", contract.NRIApp, contract.MetricNRIConnected, e.Node)
	default:
		f.fact("%s is connected to containerd's NRI", contract.NRIApp)
	}
	f.unread(contract.NRIApp+"'s pod", d.Unread)
	refusedPods(e.NRI, &f)
	return f.verdict("give the doctor the cluster (--kubeconfig, --node) or nvinject-nri's metrics (--nri-metrics)")
}

// refusedPods lists the containers containerd refused because nvinject-nri
// was not connected; with no other problem found they are the problem.
func refusedPods(n evidence.NRIEvidence, f *finding) {
	if n.ErrorsUnread != "" {
		f.unread("container errors on the node", n.ErrorsUnread)
		return
	}
	for _, c := range n.CreateErrors {
		if !requiredPluginRefusal(c.Message) {
			continue
		}
		if len(f.problems) > 0 {
			f.fact("containerd refused %s fail-closed: %s", c.PodRef, contract.Quote(c.Message))
			continue
		}
		f.problem(fixRefusedConnected, "containerd refused %s fail-closed though nvinject-nri looks connected: %s", c.PodRef, contract.Quote(c.Message))
	}
}

// nriStartFix tells how to get nvinject-nri's pod running: a hostPath
// kubelet cannot mount names the volume to point elsewhere.
func nriStartFix(d evidence.DaemonEvidence) string {
	for _, ev := range d.Events {
		m := mountVolume.FindStringSubmatch(ev.Message)
		if ev.Reason != "FailedMount" || m == nil {
			continue
		}
		want, ok := nriVolumeFixes[m[1]]
		if !ok {
			want = "a path that exists on the node"
		}
		return fmt.Sprintf("kubelet cannot mount volume %s: set its hostPath in the %s DaemonSet (volume %s in deploy/base/nri-daemonset.yaml, or a Kustomize patch in your overlay; the Helm chart has no value for it: templates/nri-daemonset.yaml) to %s", m[1], contract.NRIApp, m[1], want)
	}
	return daemonFix(d)
}
