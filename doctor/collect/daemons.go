package collect

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
)

// maxDaemonMessage bounds the last error quoted from a daemon's pod.
const maxDaemonMessage = 600

// collectDaemon finds app's pod on node (label contract.AppLabel=app in
// namespace) and reads its state: whether it runs, how often it restarted,
// and the message its last run ended with (the DaemonSets set
// terminationMessagePolicy: FallbackToLogsOnError, so that is the daemon's
// own last error).
func collectDaemon(ctx context.Context, c kubernetes.Interface, namespace, app, node string, port int) evidence.DaemonEvidence {
	ev := evidence.DaemonEvidence{App: app, Namespace: namespace}
	pods, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: contract.AppLabel + "=" + app,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		ev.Unread = fmt.Sprintf("list pods %s=%s in %s: %v", contract.AppLabel, app, namespace, err)
		return ev
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != node || p.DeletionTimestamp != nil {
			continue
		}
		if pod == nil || p.CreationTimestamp.After(pod.CreationTimestamp.Time) {
			pod = p
		}
	}
	if pod == nil {
		return ev
	}
	ev.Pod, ev.Phase = pod.Name, string(pod.Status.Phase)
	if pod.Status.PodIP != "" && port > 0 {
		ev.MetricsURL = "http://" + joinHostPort(pod.Status.PodIP, port) + "/metrics"
	}
	ev.MIGStrategy = migStrategy(pod, app)
	if dir, ok := podFlag(pod, "--cdi-spec-dir"); ok {
		ev.CDISpecDir = hostPathOf(pod, dir)
	} else {
		ev.CDISpecDir = hostPathOf(pod, contract.CDISpecDir)
	}
	ev.HostDriverRoot = hostDriverRoot(pod)
	for _, cs := range pod.Status.ContainerStatuses {
		ev.Restarts += cs.RestartCount
		ev.Ready = cs.Ready
		if w := cs.State.Waiting; w != nil {
			ev.Waiting, ev.WaitingMessage = w.Reason, cutTail(w.Message)
		}
		if t := cs.State.Terminated; t != nil {
			ev.LastError = terminationText(t)
		} else if t := cs.LastTerminationState.Terminated; t != nil && t.ExitCode != 0 {
			ev.LastError = terminationText(t)
		}
	}
	if !ev.Running() {
		ev.Events = daemonEvents(ctx, c, pod)
	}
	return ev
}

// migStrategy is the --mig-strategy pod's daemon runs with: the flag, which
// wins, else the MIG_STRATEGY it sets, else app's default (none for the
// device plugin, mixed for nvinject-dra); "" for a value from a ConfigMap
// or Secret, which the doctor does not read.
func migStrategy(pod *corev1.Pod, app string) string {
	const env = "MIG_STRATEGY"
	if v, ok := podFlag(pod, "--mig-strategy"); ok {
		return v
	}
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == env && e.ValueFrom != nil {
				return ""
			}
			if e.Name == env {
				return e.Value
			}
		}
	}
	if app == contract.DRAApp {
		return string(gpuselect.MIGMixed)
	}
	return string(gpuselect.MIGNone)
}

// podFlag is the value of flag (--name=v or --name v) on the command line
// of pod's containers.
func podFlag(pod *corev1.Pod, flag string) (string, bool) {
	for _, c := range pod.Spec.Containers {
		args := append(slices.Clone(c.Command), c.Args...)
		for i, a := range args {
			if v, ok := strings.CutPrefix(a, flag+"="); ok {
				return v, true
			}
			if a == flag && i+1 < len(args) {
				return args[i+1], true
			}
		}
	}
	return "", false
}

// hostPathOf is where path inside pod's container is on the host: under the
// hostPath volume mounted deepest above it; path itself when none is.
func hostPathOf(pod *corev1.Pod, path string) string {
	hostPaths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	best, out := -1, path
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			host, ok := hostPaths[m.Name]
			mp := strings.TrimSuffix(m.MountPath, "/")
			if !ok || len(mp) <= best || (path != mp && !strings.HasPrefix(path, mp+"/")) {
				continue
			}
			best, out = len(mp), filepath.Join(host, m.SubPath, strings.TrimPrefix(path, mp))
		}
	}
	return out
}

// hostDriverRoot is the driver root pod's daemon names in its CDI spec,
// as the daemon defaults it: --host-driver-root, else --driver-root.
func hostDriverRoot(pod *corev1.Pod) string {
	if v, ok := podFlag(pod, "--host-driver-root"); ok && v != "" {
		return v
	}
	v, _ := podFlag(pod, "--driver-root")
	return v
}

// maxDaemonEvents bounds how many of a daemon pod's events are quoted.
const maxDaemonEvents = contract.MaxListed

// daemonEvents are pod's latest Warning events, one per reason, newest
// first: kubelet's and the runtime's words for why the pod does not run
// (FailedMount, FailedCreatePodSandBox, BackOff). An unreadable list
// leaves them out; the pod's state still says it does not run.
func daemonEvents(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod) []evidence.DaemonEvent {
	list, err := c.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.name", pod.Name), fields.OneTermEqualSelector("type", corev1.EventTypeWarning)).String()})
	if err != nil {
		return nil
	}
	latest := map[string]corev1.Event{}
	// The guard repeats the field selector for API fakes that ignore it.
	for _, e := range list.Items {
		if e.InvolvedObject.Name != pod.Name || e.InvolvedObject.Kind != "Pod" || e.Type != corev1.EventTypeWarning {
			continue
		}
		if old, ok := latest[e.Reason]; !ok || eventTime(e).After(eventTime(old).Time) {
			latest[e.Reason] = e
		}
	}
	events := slices.Collect(maps.Values(latest))
	slices.SortFunc(events, func(a, b corev1.Event) int { return eventTime(b).Compare(eventTime(a).Time) })
	var out []evidence.DaemonEvent
	for _, e := range events[:min(len(events), maxDaemonEvents)] {
		out = append(out, evidence.DaemonEvent{Reason: e.Reason, Message: cutTail(e.Message)})
	}
	return out
}

// cutTail bounds a message quoted from a pod, keeping its end, where the
// error usually is.
func cutTail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > maxDaemonMessage {
		return "…" + s[len(s)-maxDaemonMessage:]
	}
	return s
}

func joinHostPort(ip string, port int) string {
	if strings.Contains(ip, ":") {
		return "[" + ip + "]:" + strconv.Itoa(port)
	}
	return ip + ":" + strconv.Itoa(port)
}

// terminationText is a terminated container's reason, exit code and the
// last lines of its message, bounded.
func terminationText(t *corev1.ContainerStateTerminated) string {
	msg := cutTail(t.Message)
	s := fmt.Sprintf("%s (exit code %d)", t.Reason, t.ExitCode)
	if msg != "" {
		s += ": " + msg
	}
	return s
}
