package doctor

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/shared/contract"
)

// maxDaemonMessage bounds the last error quoted from a daemon's pod.
const maxDaemonMessage = 600

// collectDaemon finds app's pod on node (label contract.AppLabel=app in
// namespace) and reads its state: whether it runs, how often it restarted,
// and the message its last run ended with (the DaemonSets set
// terminationMessagePolicy: FallbackToLogsOnError, so that is the daemon's
// own last error).
func collectDaemon(ctx context.Context, c kubernetes.Interface, namespace, app, node string, port int) DaemonEvidence {
	ev := DaemonEvidence{App: app, Namespace: namespace}
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
	for _, cs := range pod.Status.ContainerStatuses {
		ev.Restarts += cs.RestartCount
		ev.Ready = cs.Ready
		if w := cs.State.Waiting; w != nil {
			ev.Waiting = w.Reason
		}
		if t := cs.State.Terminated; t != nil {
			ev.LastError = terminationText(t)
		} else if t := cs.LastTerminationState.Terminated; t != nil && t.ExitCode != 0 {
			ev.LastError = terminationText(t)
		}
	}
	return ev
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
	msg := strings.TrimSpace(t.Message)
	if len(msg) > maxDaemonMessage {
		msg = "…" + msg[len(msg)-maxDaemonMessage:]
	}
	s := fmt.Sprintf("%s (exit code %d)", t.Reason, t.ExitCode)
	if msg != "" {
		s += ": " + msg
	}
	return s
}

// known says whether the daemon's pod was looked up (through the API).
func (d DaemonEvidence) known() bool { return d.App != "" && d.Unread == "" }

// running says whether the daemon's pod runs and is ready.
func (d DaemonEvidence) running() bool {
	return d.Unread == "" && d.Pod != "" && d.Phase == string(corev1.PodRunning) && d.Ready && d.Waiting == ""
}

// describe is the daemon's state in one line.
func (d DaemonEvidence) describe() string {
	switch {
	case d.Unread != "":
		return d.Unread
	case d.Pod == "":
		return fmt.Sprintf("no %s pod (%s=%s in %s) on the node", d.App, contract.AppLabel, d.App, d.Namespace)
	}
	s := fmt.Sprintf("pod %s/%s %s ready=%t restarts=%d", d.Namespace, d.Pod, d.Phase, d.Ready, d.Restarts)
	if d.Waiting != "" {
		s += " waiting=" + d.Waiting
	}
	if d.LastError != "" {
		s += "; last run ended " + d.LastError
	}
	return s
}
