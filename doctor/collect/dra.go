package collect

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/contract"
)

// detectMode decides which component owns the node's GPUs: --mode when
// given, else the node label deploy/ schedules by, else the daemon that
// runs there.
func detectMode(forced string, n evidence.NodeEvidence, plugin, draPod evidence.DaemonEvidence) evidence.ModeEvidence {
	switch {
	case forced != "":
		return evidence.ModeEvidence{Mode: forced, Source: "--mode " + forced}
	case n.ModeLabel == contract.DRAModeDRA || n.ModeLabel == contract.DRAModeDevicePlugin:
		return evidence.ModeEvidence{Mode: n.ModeLabel, Source: "Node label " + contract.DRAModeLabel + "=" + n.ModeLabel}
	case draPod.Pod != "" && plugin.Pod == "":
		return evidence.ModeEvidence{Mode: contract.DRAModeDRA, Source: "an " + contract.DRAApp + " pod and no " + contract.DevicePluginApp + " pod on the node"}
	}
	return evidence.ModeEvidence{Mode: contract.DRAModeDevicePlugin, Source: "default (no " + contract.DRAModeLabel + " label, no " + contract.DRAApp + " pod alone on the node)"}
}

// collectDRA reads the DRA objects of the node: the driver's ResourceSlices
// and DeviceClass, the claims allocated from them or used by the node's
// pods, the containers' device health, and nvinject-dra's metrics.
func collectDRA(ctx context.Context, c kubernetes.Interface, node string, o Options, pod evidence.DaemonEvidence) *evidence.DRAEvidence {
	ev := &evidence.DRAEvidence{Class: evidence.DeviceClassEvidence{Name: contract.DRADriver}}
	ev.Metrics = collectDRAMetrics(ctx, o, pod)
	if c == nil {
		why := "no API server: " + noKubeWhy(o)
		ev.Slices.Unread, ev.Class.Unread, ev.Claims.Unread = why, why, why
		return ev
	}
	ev.Slices = collectSlices(ctx, c, node)
	ev.Class = collectDeviceClass(ctx, c)
	// nvinject-dra names its pool after the node; a claim may still hold a
	// device of it after the slice is gone.
	pools := map[string]bool{node: true}
	for _, d := range ev.Slices.Devices {
		pools[d.Pool] = true
	}
	ev.Claims = collectClaims(ctx, c, node, pools)
	return ev
}

func noKubeWhy(o Options) string {
	if o.NoKube {
		return "--no-kube"
	}
	return "see the other layers"
}

func collectSlices(ctx context.Context, c kubernetes.Interface, node string) evidence.SliceEvidence {
	var ev evidence.SliceEvidence
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
		fields.OneTermEqualSelector("spec.driver", contract.DRADriver), fields.OneTermEqualSelector("spec.nodeName", node)).String()})
	if err != nil {
		ev.Unread = fmt.Sprintf("list ResourceSlices of driver %s on %s: %v", contract.DRADriver, node, err)
		return ev
	}
	for _, s := range list.Items {
		// The guard repeats the field selectors for API fakes that ignore them.
		if s.Spec.Driver != contract.DRADriver || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			continue
		}
		ev.Slices = append(ev.Slices, s.Name)
		for _, d := range s.Spec.Devices {
			sd := evidence.SliceDevice{Pool: s.Spec.Pool.Name, Name: d.Name}
			for attr, to := range map[string]*string{contract.DRAAttrUUID: &sd.UUID, contract.DRAAttrType: &sd.Type, contract.DRAAttrProfile: &sd.Profile} {
				if a, ok := d.Attributes[resourceapi.QualifiedName(attr)]; ok && a.StringValue != nil {
					*to = *a.StringValue
				}
			}
			if m, ok := d.Capacity[contract.DRACapacityMemory]; ok {
				sd.Memory = m.Value.String()
			}
			for _, t := range d.Taints {
				sd.Taints = append(sd.Taints, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
			}
			ev.Devices = append(ev.Devices, sd)
		}
	}
	slices.Sort(ev.Slices)
	slices.SortFunc(ev.Devices, func(a, b evidence.SliceDevice) int { return strings.Compare(a.ID(), b.ID()) })
	return ev
}

func collectDeviceClass(ctx context.Context, c kubernetes.Interface) evidence.DeviceClassEvidence {
	ev := evidence.DeviceClassEvidence{Name: contract.DRADriver}
	dc, err := c.ResourceV1().DeviceClasses().Get(ctx, contract.DRADriver, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return ev
	case err != nil:
		ev.Unread = fmt.Sprintf("get DeviceClass %s: %v", contract.DRADriver, err)
		return ev
	}
	ev.Exists = true
	if n := dc.Spec.ExtendedResourceName; n != nil {
		ev.ExtendedResourceName = *n
	}
	return ev
}

// collectClaims keeps the claims allocated from the node's pools or named by
// a pod on the node, with those pods' device health.
func collectClaims(ctx context.Context, c kubernetes.Interface, node string, pools map[string]bool) evidence.ClaimsEvidence {
	var ev evidence.ClaimsEvidence
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		ev.Unread = fmt.Sprintf("list pods on %s: %v", node, err)
		return ev
	}
	claims, err := c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		ev.Unread = fmt.Sprintf("list ResourceClaims: %v", err)
		return ev
	}
	users := map[string][]evidence.PodRef{}
	health := map[evidence.PodRef][]evidence.ResourceHealth{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != node || terminal(p) {
			continue
		}
		for _, name := range podClaimNames(p) {
			k := p.Namespace + "/" + name
			users[k] = append(users[k], ref(p))
		}
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				if !strings.HasPrefix(string(rs.Name), "claim:") {
					continue
				}
				for _, h := range rs.Resources {
					health[ref(p)] = append(health[ref(p)], evidence.ResourceHealth{
						PodRef:   evidence.PodRef{Namespace: p.Namespace, Name: p.Name, Container: cs.Name},
						Resource: string(rs.Name), ID: string(h.ResourceID), Health: string(h.Health)})
				}
			}
		}
	}
	for i := range claims.Items {
		rc := &claims.Items[i]
		cl := claimOf(rc, pools)
		cl.Pods = users[cl.String()]
		if len(cl.Devices) == 0 && len(cl.Pods) == 0 {
			continue
		}
		ev.Claims = append(ev.Claims, cl)
		for _, p := range cl.Pods {
			ev.Health = append(ev.Health, health[p]...)
			delete(health, p)
		}
	}
	slices.SortFunc(ev.Claims, func(a, b evidence.Claim) int { return strings.Compare(a.String(), b.String()) })
	return ev
}

// podClaimNames are the ResourceClaims a pod's status names: its own claims
// and the one the scheduler made for its extended resources.
func podClaimNames(p *corev1.Pod) []string {
	var out []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			out = append(out, *s.ResourceClaimName)
		}
	}
	if x := p.Status.ExtendedResourceClaimStatus; x != nil && x.ResourceClaimName != "" {
		out = append(out, x.ResourceClaimName)
	}
	return out
}

// claimOf summarises rc; Devices holds only the driver's results from pools
// (nil: from any pool).
func claimOf(rc *resourceapi.ResourceClaim, pools map[string]bool) evidence.Claim {
	cl := evidence.Claim{Namespace: rc.Namespace, Name: rc.Name, Extended: rc.Annotations[resourceapi.ExtendedResourceClaimAnnotation] == "true"}
	if a := rc.Status.Allocation; a != nil {
		cl.Allocated = true
		for _, r := range a.Devices.Results {
			if r.Driver == contract.DRADriver && (pools == nil || pools[r.Pool]) {
				cd := evidence.ClaimDevice{Request: r.Request, Driver: r.Driver, Pool: r.Pool, Device: r.Device, AdminAccess: r.AdminAccess != nil && *r.AdminAccess}
				if r.ShareID != nil {
					cd.ShareID = string(*r.ShareID)
				}
				for n, q := range r.ConsumedCapacity {
					cd.Consumed = append(cd.Consumed, string(n)+"="+q.String())
				}
				slices.Sort(cd.Consumed)
				cl.Devices = append(cl.Devices, cd)
			}
		}
	}
	for _, r := range rc.Status.ReservedFor {
		if r.Resource == "pods" {
			cl.ReservedFor = append(cl.ReservedFor, rc.Namespace+"/"+r.Name)
		}
	}
	return cl
}

func collectDRAMetrics(ctx context.Context, o Options, pod evidence.DaemonEvidence) evidence.DRAMetricsEvidence {
	ev := evidence.DRAMetricsEvidence{URL: metricsURL(o.DRAMetrics, pod)}
	f, unread := fetchMetrics(ctx, o, ev.URL, "dra-metrics", pod)
	if unread != "" {
		ev.Unread = unread
		return ev
	}
	ev.Registered = f.Sum(contract.MetricDRARegistered)
	ev.Prepared = f.Sum(contract.MetricDRAPrepared)
	ev.PrepareErrors = orZero(f.SumWhere(contract.MetricDRAPrepares, "result", "error"))
	ev.HealthStreams = f.Sum(contract.MetricDRAHealthStreams)
	ev.HealthEvents = healthEvents(f, contract.MetricDRAHealthEvents)
	ev.Devices = deviceHealth(f, contract.MetricDRADeviceHealthy)
	return ev
}
