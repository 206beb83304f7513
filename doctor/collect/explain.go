package collect

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// DefaultPodNamespace is the namespace explain looks in without
// --pod-namespace, as kubectl does.
const DefaultPodNamespace = "default"

// maxRecords bounds the audit Events explain reads for one pod (the newest).
const maxRecords = 20

// Pod reads what explain needs about pod o.PodNamespace/name.
// Unreadable parts say why; only an unreadable pod leaves the rest unread.
func Pod(ctx context.Context, o Options, name string) evidence.ExplainEvidence {
	o = o.WithDefaults()
	ns := o.PodNamespace
	if ns == "" {
		ns = DefaultPodNamespace
	}
	e := evidence.ExplainEvidence{Pod: evidence.PodRef{Namespace: ns, Name: name}, Resource: o.Resource, Now: o.Now().UTC()}
	c, _, why := kubeClient(o)
	if why != "" {
		e.Unread = why
		return e
	}
	p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.Unread = fmt.Sprintf("get pod %s/%s: %v", ns, name, err)
		return e
	}
	e.UID, e.Node, e.Phase, e.Created = string(p.UID), p.Spec.NodeName, string(p.Status.Phase), p.CreationTimestamp.UTC()
	if p.Spec.RuntimeClassName != nil {
		e.RuntimeClass = *p.Spec.RuntimeClassName
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
			e.Unscheduled = cutTail(cond.Message)
		}
	}
	e.Containers = explainContainers(p, o.Resource)
	e.Claims, e.ClaimsUnread = explainClaims(ctx, c, p)
	e.Records, e.RecordsUnread = auditRecords(ctx, c, p)
	if e.Node != "" {
		e.NRI = explainNRI(ctx, c, o, e.Node)
	}
	return e
}

// explainContainers lists the pod's containers, init containers first,
// with what they ask for and their status.
func explainContainers(p *corev1.Pod, resource string) []evidence.ExplainContainer {
	claimName := map[string]string{} // the spec's claim name → the ResourceClaim's
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			claimName[s.Name] = *s.ResourceClaimName
		}
	}
	status := map[string]corev1.ContainerStatus{}
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		status[cs.Name] = cs
	}
	var out []evidence.ExplainContainer
	add := func(c corev1.Container, init bool) {
		ec := evidence.ExplainContainer{Name: c.Name, Init: init, GPUs: gpuRequest(corev1.PodSpec{Containers: []corev1.Container{c}}, resource)}
		for _, rc := range c.Resources.Claims {
			name := claimName[rc.Name]
			if name == "" {
				name = rc.Name + " (no ResourceClaim yet)"
			}
			ec.Claims = append(ec.Claims, evidence.ClaimRef{Claim: name, Request: rc.Request})
		}
		if x := p.Status.ExtendedResourceClaimStatus; x != nil {
			for _, m := range x.RequestMappings {
				if m.ContainerName == c.Name {
					ec.Claims = append(ec.Claims, evidence.ClaimRef{Claim: x.ResourceClaimName, Request: m.RequestName})
				}
			}
		}
		cs, ok := status[c.Name]
		if ok {
			ec.Ready, ec.Started = cs.Ready, cs.ContainerID != "" || cs.LastTerminationState.Terminated != nil
			switch s := cs.State; {
			case s.Running != nil:
				ec.State = "running"
			case s.Terminated != nil:
				ec.State, ec.Reason, ec.Message = "terminated", s.Terminated.Reason, cutTail(s.Terminated.Message)
			case s.Waiting != nil:
				ec.State, ec.Reason, ec.Message = "waiting", s.Waiting.Reason, cutTail(s.Waiting.Message)
			}
		}
		out = append(out, ec)
	}
	for _, c := range p.Spec.InitContainers {
		add(c, true)
	}
	for _, c := range p.Spec.Containers {
		add(c, false)
	}
	return out
}

// explainClaims reads the pod's ResourceClaims (those its status names).
func explainClaims(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) ([]evidence.Claim, string) {
	var out []evidence.Claim
	for _, name := range podClaimNames(p) {
		rc, err := c.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return out, fmt.Sprintf("get ResourceClaim %s/%s: %v", p.Namespace, name, err)
		}
		out = append(out, claimOf(rc, nil))
	}
	return out, ""
}

// auditRecords are nvinject-nri's audit Events on this pod (this UID, not
// an earlier pod of the same name), oldest first, the newest maxRecords.
func auditRecords(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) ([]evidence.AuditRecord, string) {
	list, err := c.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.kind", "Pod"), fields.OneTermEqualSelector("involvedObject.name", p.Name)).String()})
	if err != nil {
		return nil, fmt.Sprintf("list Events of pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	var out []evidence.AuditRecord
	// The guard repeats the field selector for API fakes that ignore it.
	for _, ev := range list.Items {
		o := ev.InvolvedObject
		if o.Kind != "Pod" || o.Name != p.Name || (o.UID != "" && o.UID != p.UID) || ev.Source.Component != contract.EventSource ||
			(ev.Reason != contract.EventReasonGPUAdmitted && ev.Reason != contract.EventReasonGPURefused) {
			continue
		}
		r := evidence.AuditRecord{Reason: ev.Reason, Count: max(ev.Count, 1), First: ev.FirstTimestamp.UTC(), Last: eventTime(ev).UTC(), Host: ev.Source.Host}
		if r.First.IsZero() {
			r.First = r.Last
		}
		n, err := contract.ParseAuditNote(ev.Message)
		if err != nil {
			r.Unparsed = contract.Quote(ev.Message)
		}
		r.Note = n
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b evidence.AuditRecord) int { return a.Last.Compare(b.Last) })
	return out[max(0, len(out)-maxRecords):], ""
}

// explainNRI reads nvinject-nri's pod on node and its audit metrics.
func explainNRI(ctx context.Context, c kubernetes.Interface, o Options, node string) evidence.ExplainNRI {
	ev := evidence.ExplainNRI{Pod: collectDaemon(ctx, c, o.DaemonNamespace, contract.NRIApp, node, contract.NRIMetricsPort)}
	ev.MetricsURL = metricsURL(o.NRIMetrics, ev.Pod)
	f, unread := fetchMetrics(ctx, o, ev.MetricsURL, "nri-metrics", ev.Pod)
	if unread != "" {
		ev.MetricsUnread = unread
		return ev
	}
	ev.AuditEnabled = f.Sum(contract.MetricNRIAuditEnabled)
	for _, s := range f[contract.MetricNRIAuditEvents] {
		if ev.AuditOutcomes == nil {
			ev.AuditOutcomes = map[string]float64{}
		}
		ev.AuditOutcomes[s.Labels["outcome"]] += s.Value
	}
	return ev
}
