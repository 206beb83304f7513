package collect

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/doctor/kubeexec"
	"github.com/nvinject/nvinject/shared/contract"
)

// clientAndExec builds a clientset from a kubeconfig path (empty:
// KUBECONFIG or ~/.kube/config) and an ExecFunc running commands in
// containers through the same API server.
func clientAndExec(kubeconfig string) (kubernetes.Interface, ExecFunc, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, nil, fmt.Errorf("load kubeconfig (pass --kubeconfig or set KUBECONFIG): %w", err)
	}
	cfg.Timeout = defaultAPITimeout
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	exec := func(ctx context.Context, ns, pod, container string, cmd ...string) (string, error) {
		return kubeexec.Exec(ctx, cfg, cs, ns, pod, container, cmd...)
	}
	return cs, exec, nil
}

// Client builds a clientset from a kubeconfig path (empty: KUBECONFIG or
// ~/.kube/config), as the node's walk does.
func Client(kubeconfig string) (kubernetes.Interface, error) {
	c, _, err := clientAndExec(kubeconfig)
	return c, err
}

// resolveNode returns the node to examine.
func resolveNode(ctx context.Context, c kubernetes.Interface, name, resource string) (string, error) {
	if name != "" {
		return name, nil
	}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list nodes to pick the worker (or pass --node): %w", err)
	}
	if len(nodes.Items) == 1 {
		return nodes.Items[0].Name, nil
	}
	var gpu []string
	for _, n := range nodes.Items {
		if _, ok := n.Status.Capacity[corev1.ResourceName(resource)]; ok {
			gpu = append(gpu, n.Name)
		}
	}
	if len(gpu) == 1 {
		return gpu[0], nil
	}
	return "", fmt.Errorf("%d nodes, %d publishing %s: pass --node", len(nodes.Items), len(gpu), resource)
}

func nodeStatus(ctx context.Context, c kubernetes.Interface, node, resource string) evidence.NodeEvidence {
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return evidence.NodeEvidence{Unread: fmt.Sprintf("get Node %s: %v", node, err)}
	}
	ev := evidence.NodeEvidence{}
	rn := corev1.ResourceName(resource)
	if q, ok := n.Status.Capacity[rn]; ok {
		ev.Published, ev.Capacity = true, q.Value()
	}
	if q, ok := n.Status.Allocatable[rn]; ok {
		ev.Allocatable = q.Value()
	}
	ev.ModeLabel = n.Labels[contract.DRAModeLabel]
	mig := contract.MIGResourceName(resource, "")
	for name, q := range n.Status.Capacity {
		if strings.HasPrefix(string(name), mig) {
			if ev.MIGCapacity == nil {
				ev.MIGCapacity = map[string]int64{}
			}
			ev.MIGCapacity[string(name)] = q.Value()
		}
	}
	return ev
}

func collectSelected(ctx context.Context, c kubernetes.Interface, o Options) evidence.SelectedEvidence {
	ev := evidence.SelectedEvidence{Source: fmt.Sprintf("ConfigMap %s/%s key %s", o.ConfigMapNamespace, o.ConfigMapName, o.ConfigMapKey)}
	cm, err := c.CoreV1().ConfigMaps(o.ConfigMapNamespace).Get(ctx, o.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		ev.Unread = fmt.Sprintf("get %s: %v", ev.Source, err)
		return ev
	}
	v, ok := cm.Data[o.ConfigMapKey]
	if !ok {
		ev.Unread = ev.Source + " is not set"
		return ev
	}
	for _, u := range strings.Split(v, ",") {
		switch u = strings.TrimSpace(u); u {
		case "":
		case "all":
			ev.All = true
		default:
			ev.UUIDs = append(ev.UUIDs, u)
		}
	}
	return ev
}

func gpuRequest(spec corev1.PodSpec, resource string) int64 {
	rn := corev1.ResourceName(resource)
	amount := func(c corev1.Container) int64 {
		if q, ok := c.Resources.Requests[rn]; ok {
			return q.Value()
		}
		if q, ok := c.Resources.Limits[rn]; ok {
			return q.Value()
		}
		return 0
	}
	var sum, initMax int64
	for _, c := range spec.Containers {
		sum += amount(c)
	}
	for _, c := range spec.InitContainers {
		initMax = max(initMax, amount(c))
	}
	return max(sum, initMax)
}

func ref(p *corev1.Pod) evidence.PodRef { return evidence.PodRef{Namespace: p.Namespace, Name: p.Name} }

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// kubeFacts is what one pass over the API yields for the node-bound layers.
type kubeFacts struct {
	ledger   evidence.LedgerEvidence
	allocate evidence.AllocateEvidence
	create   []evidence.PodMessage
	err      string
}

// kubeletFailedPrepare is kubelet's event reason when NodePrepareResources
// failed for one of the pod's claims.
const kubeletFailedPrepare = "FailedPrepareDynamicResources"

// createReasons are container waiting/terminated reasons that mean the
// runtime could not create or start the container.
var createReasons = []string{"CreateContainerError", "RunContainerError", "CreateContainerConfigError", "StartError"}

// collectPods reads the pods bound to the node, pending GPU pods and
// warning events, and sorts them into the ledger, Allocate failures and
// container creation errors. Events of pods that no longer exist are
// ignored, so a fixed and re-created workload is not reported broken.
func collectPods(ctx context.Context, c kubernetes.Interface, node, resource string) kubeFacts {
	var kf kubeFacts
	bound, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		kf.err = fmt.Sprintf("list pods on %s: %v", node, err)
		return kf
	}
	pending, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=,status.phase=Pending"})
	if err != nil {
		kf.err = fmt.Sprintf("list pending pods: %v", err)
		return kf
	}
	events, err := c.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil {
		kf.err = fmt.Sprintf("list warning events: %v", err)
		return kf
	}
	latest := map[evidence.PodRef]map[string]corev1.Event{}
	for _, ev := range events.Items {
		if ev.InvolvedObject.Kind != "Pod" {
			continue
		}
		r := evidence.PodRef{Namespace: ev.InvolvedObject.Namespace, Name: ev.InvolvedObject.Name}
		if latest[r] == nil {
			latest[r] = map[string]corev1.Event{}
		}
		if old, ok := latest[r][ev.Reason]; !ok || eventTime(ev).After(eventTime(old).Time) {
			latest[r][ev.Reason] = ev
		}
	}
	// The guards repeat the field selectors for API fakes that ignore them.
	for i := range bound.Items {
		p := &bound.Items[i]
		if p.Spec.NodeName != node {
			continue
		}
		boundPod(p, resource, latest[ref(p)], &kf)
	}
	for i := range pending.Items {
		p := &pending.Items[i]
		if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending || (gpuRequest(p.Spec, resource) == 0 && len(p.Spec.ResourceClaims) == 0) {
			continue
		}
		msg := ""
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
				msg = cond.Message
			}
		}
		if ev, ok := latest[ref(p)]["FailedScheduling"]; ok && msg == "" {
			msg = ev.Message
		}
		kf.ledger.Pending = append(kf.ledger.Pending, evidence.PodMessage{PodRef: ref(p), Reason: "FailedScheduling", Message: msg})
	}
	return kf
}

func boundPod(p *corev1.Pod, resource string, events map[string]corev1.Event, kf *kubeFacts) {
	r := ref(p)
	if strings.Contains(p.Status.Message, "Allocate failed") {
		kf.allocate.Failures = append(kf.allocate.Failures, evidence.PodMessage{PodRef: r, Reason: p.Status.Reason, Message: p.Status.Message})
	} else if ev, ok := events["UnexpectedAdmissionError"]; ok && strings.Contains(ev.Message, "Allocate failed") {
		kf.allocate.Failures = append(kf.allocate.Failures, evidence.PodMessage{PodRef: r, Reason: ev.Reason, Message: ev.Message})
	}
	if n := gpuRequest(p.Spec, resource); n > 0 && !terminal(p) {
		kf.ledger.Holders = append(kf.ledger.Holders, evidence.GPUHolder{PodRef: r, Phase: string(p.Status.Phase), GPUs: n})
	}
	seen := false
	statuses := append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...)
	for _, cs := range statuses {
		reason, msg := "", ""
		switch {
		case cs.State.Waiting != nil:
			reason, msg = cs.State.Waiting.Reason, cs.State.Waiting.Message
		case cs.State.Terminated != nil:
			reason, msg = cs.State.Terminated.Reason, cs.State.Terminated.Message
		}
		if slices.Contains(createReasons, reason) {
			seen = true
			kf.create = append(kf.create, evidence.PodMessage{PodRef: evidence.PodRef{Namespace: p.Namespace, Name: p.Name, Container: cs.Name}, Reason: reason, Message: msg})
		}
	}
	if terminal(p) {
		return
	}
	if ev, ok := events[kubeletFailedPrepare]; ok {
		kf.allocate.PrepareFailures = append(kf.allocate.PrepareFailures, evidence.PodMessage{PodRef: r, Reason: ev.Reason, Message: ev.Message})
	}
	// The sandbox error and the creation event carry the runtime's text
	// when the container status does not (yet).
	for _, reason := range []string{"FailedCreatePodSandBox", "Failed"} {
		ev, ok := events[reason]
		if !ok || (reason == "Failed" && seen) || strings.Contains(ev.Message, "ImagePull") || strings.Contains(ev.Message, "pull image") {
			continue
		}
		kf.create = append(kf.create, evidence.PodMessage{PodRef: r, Reason: reason, Message: ev.Message})
	}
}

func eventTime(e corev1.Event) metav1.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp
	case !e.EventTime.IsZero():
		return metav1.Time{Time: e.EventTime.Time}
	}
	return e.CreationTimestamp
}

func collectRuntimeClass(ctx context.Context, c kubernetes.Interface, name string) evidence.RuntimeClassEvidence {
	rc, err := c.NodeV1().RuntimeClasses().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return evidence.RuntimeClassEvidence{}
	case err != nil:
		return evidence.RuntimeClassEvidence{Unread: fmt.Sprintf("get RuntimeClass %s: %v", name, err)}
	}
	return evidence.RuntimeClassEvidence{Exists: true, Handler: rc.Handler}
}

// appSelector describes which pods the application layer examines.
func appSelector(o Options) string {
	sel := o.PodSelector
	if sel == "" {
		sel = "pods requesting " + o.Resource + " or holding a " + contract.DRADriver + " claim on the node"
	}
	if o.PodNamespace != "" {
		sel = o.PodNamespace + "/" + sel
	}
	return sel
}

// collectApp reads the application's pods: those PodSelector selects, or
// by default every pod on the node that requests the GPU resource or holds
// one of the DRA claims dra found.
func collectApp(ctx context.Context, c kubernetes.Interface, node string, o Options, dra *evidence.DRAEvidence) evidence.AppEvidence {
	ev := evidence.AppEvidence{Selector: appSelector(o)}
	lo := metav1.ListOptions{LabelSelector: o.PodSelector}
	if o.PodSelector == "" {
		lo.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}
	pods, err := c.CoreV1().Pods(o.PodNamespace).List(ctx, lo)
	if err != nil {
		ev.Unread = fmt.Sprintf("list %s: %v", ev.Selector, err)
		return ev
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if o.PodSelector == "" && (p.Spec.NodeName != node || (gpuRequest(p.Spec, o.Resource) == 0 && !uses(dra, ref(p)))) {
			continue
		}
		ap := evidence.AppPod{PodRef: ref(p), Phase: string(p.Status.Phase), NodeName: p.Spec.NodeName}
		for _, cs := range p.Status.ContainerStatuses {
			st := appContainer(ctx, c, p, cs, o.LogTailLines)
			if st.State == "running" && o.Exec != nil {
				st.Probe = runProbe(ctx, o.Exec, p.Namespace, p.Name, cs.Name, o.Probe)
			}
			ap.Containers = append(ap.Containers, st)
		}
		ev.Pods = append(ev.Pods, ap)
	}
	return ev
}

func appContainer(ctx context.Context, c kubernetes.Interface, p *corev1.Pod, cs corev1.ContainerStatus, tail int64) evidence.ContainerState {
	st := evidence.ContainerState{Name: cs.Name, Restarts: cs.RestartCount, Ready: cs.Ready}
	switch s := cs.State; {
	case s.Running != nil:
		st.State = "running"
	case s.Terminated != nil:
		st.State, st.Reason, st.Message, st.ExitCode = "terminated", s.Terminated.Reason, s.Terminated.Message, s.Terminated.ExitCode
	case s.Waiting != nil:
		st.State, st.Reason, st.Message = "waiting", s.Waiting.Reason, s.Waiting.Message
	}
	if st.State == "waiting" && cs.LastTerminationState.Terminated == nil {
		return st
	}
	if st.State == "waiting" && st.ExitCode == 0 {
		st.ExitCode = cs.LastTerminationState.Terminated.ExitCode
	}
	// A crashed container's useful log is its previous run's.
	opts := &corev1.PodLogOptions{Container: cs.Name, TailLines: &tail, Previous: st.State == "waiting"}
	rc, err := c.CoreV1().Pods(p.Namespace).GetLogs(p.Name, opts).Stream(ctx)
	if err != nil {
		st.LogUnread = err.Error()
		return st
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64<<10))
	if err != nil {
		st.LogUnread = err.Error()
	}
	st.LogTail = string(b)
	return st
}

// uses says whether pod p holds one of dra's claims; false on a nil dra.
func uses(dra *evidence.DRAEvidence, p evidence.PodRef) bool {
	if dra == nil {
		return false
	}
	for _, c := range dra.Claims.Claims {
		if len(c.Devices) > 0 && slices.Contains(c.Pods, p) {
			return true
		}
	}
	return false
}
