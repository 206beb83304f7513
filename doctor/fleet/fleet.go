// Package fleet is the doctor's view of every GPU node at once
// (nvinject-doctor --all-nodes): one Row per node, read from the API server
// alone so it runs from an operator's laptop — the node's mode, GPU model,
// GPUs published and healthy, driver version, and the first broken layer
// with its fix. The per-node doctor then walks that node's chain in depth.
package fleet

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/shared/contract"
)

// Row statuses.
const (
	StatusOK     = "ok"
	StatusBroken = "broken"
)

// Row is one GPU node. Its JSON names are stable: scripts read them.
type Row struct {
	Node string `json:"node"`
	// Mode is the node's contract.DRAModeLabel, device-plugin when unset.
	Mode string `json:"mode"`
	// Model is the GPU product, from the node's GFD label or the
	// ResourceSlices' devices; "" when neither says.
	Model string `json:"model"`
	// Published and Healthy: the device plugin's capacity and allocatable
	// of nvidia.com/ resources, or the DRA slices' devices and those
	// without a NoSchedule or NoExecute taint.
	Published int64 `json:"gpusPublished"`
	Healthy   int64 `json:"gpusHealthy"`
	// Driver is the driver version the node's sources report, several
	// comma-separated when they disagree.
	Driver string `json:"driver"`
	Status string `json:"status"`
	// Layer, Reason and Fix are the first broken layer's; empty when ok.
	Layer  string `json:"layer,omitempty"`
	Reason string `json:"reason,omitempty"`
	Fix    string `json:"fix,omitempty"`
}

// Prober reads a daemon pod's /readyz body, which says why it is not
// ready. The command's is ProxyProber; tests fake it, since client-go's
// fake clientset cannot answer a proxied request with a body.
type Prober interface {
	Readyz(ctx context.Context, namespace, pod string, port int) (string, error)
}

// Options steer Rows.
type Options struct {
	// Selector is a label selector of the nodes considered; empty: all.
	Selector string
	// Namespace of nvinject's daemons; empty: contract.Namespace.
	Namespace string
	// Prober, when set, gives a not-Ready daemon's readyz reason.
	Prober Prober
}

// maxProbes bounds the readyz requests in flight at once, probeTimeout
// each one, so a hung pod costs its reason, not the table.
const (
	maxProbes    = 8
	probeTimeout = 5 * time.Second
)

// Rows reads the GPU nodes and judges each, sorted by node name. The error
// is for a list that failed: without it no row can be judged.
func Rows(ctx context.Context, c kubernetes.Interface, o Options) ([]Row, error) {
	ns := cmp.Or(o.Namespace, contract.Namespace)
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: o.Selector})
	if err != nil {
		return nil, fmt.Errorf("list nodes (selector %q): %w; check --kubeconfig and --selector", o.Selector, err)
	}
	bySlices, err := nodeSlices(ctx, c)
	if err != nil {
		return nil, err
	}
	byPods, err := daemonPods(ctx, c, ns)
	if err != nil {
		return nil, err
	}
	var rows []Row
	var probes []probe
	for i := range nodes.Items {
		n := &nodes.Items[i]
		f := facts{node: n, slices: bySlices[n.Name], pods: byPods[n.Name], namespace: ns}
		if !f.gpuNode() {
			continue
		}
		r, p := judge(f)
		if p != nil {
			p.row = len(rows)
			probes = append(probes, *p)
		}
		rows = append(rows, r)
	}
	if o.Prober != nil {
		readyzReasons(ctx, o.Prober, rows, probes)
	}
	slices.SortFunc(rows, func(a, b Row) int { return strings.Compare(a.Node, b.Node) })
	return rows, nil
}

// Broken says whether any row is broken.
func Broken(rows []Row) bool {
	return slices.ContainsFunc(rows, func(r Row) bool { return r.Status == StatusBroken })
}

// nodeSlices are the DRA driver's ResourceSlices by node. A cluster that
// does not serve resource.k8s.io/v1 has none.
func nodeSlices(ctx context.Context, c kubernetes.Interface) (map[string][]resourceapi.ResourceSlice, error) {
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.driver", contract.DRADriver).String()})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("list ResourceSlices of driver %s: %w; the doctor needs list on resourceslices.resource.k8s.io", contract.DRADriver, err)
	}
	out := map[string][]resourceapi.ResourceSlice{}
	for _, s := range list.Items {
		// The guard repeats the field selector for API fakes that ignore it.
		if s.Spec.Driver == contract.DRADriver && s.Spec.NodeName != nil {
			out[*s.Spec.NodeName] = append(out[*s.Spec.NodeName], s)
		}
	}
	return out, nil
}

// daemonApps are the app labels of nvinject's daemons a row looks for.
var daemonApps = []string{contract.DevicePluginApp, contract.DRAApp, contract.NRIApp}

// daemonPods are the newest live pod of each daemon app, by node and app.
func daemonPods(ctx context.Context, c kubernetes.Interface, ns string) (map[string]map[string]*corev1.Pod, error) {
	sel := fmt.Sprintf("%s in (%s)", contract.AppLabel, strings.Join(daemonApps, ","))
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list nvinject's daemon pods in %s: %w; check --daemon-namespace", ns, err)
	}
	out := map[string]map[string]*corev1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		app := p.Labels[contract.AppLabel]
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || !slices.Contains(daemonApps, app) {
			continue
		}
		if out[p.Spec.NodeName] == nil {
			out[p.Spec.NodeName] = map[string]*corev1.Pod{}
		}
		if old := out[p.Spec.NodeName][app]; old == nil || p.CreationTimestamp.After(old.CreationTimestamp.Time) {
			out[p.Spec.NodeName][app] = p
		}
	}
	return out, nil
}

// readyzReasons asks each probe's pod why it is not ready and puts the
// answer's first line into its row's reason; an unanswered probe leaves
// the reason the pod's state gave.
func readyzReasons(ctx context.Context, pr Prober, rows []Row, probes []probe) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxProbes)
	for _, p := range probes {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			defer cancel()
			body, err := pr.Readyz(pctx, p.namespace, p.pod, p.port)
			r := &rows[p.row]
			if line := firstLine(body); err == nil && line != "" {
				r.Reason = p.reason + ": readyz: " + line
			} else if err != nil {
				r.Reason += "; readyz unreadable: " + firstLine(err.Error())
			}
		})
	}
	wg.Wait()
}

// maxQuoted bounds a line quoted from a daemon or the node into a reason.
const maxQuoted = 200

// firstLine is s's first non-empty line, bounded.
func firstLine(s string) string {
	for l := range strings.Lines(s) {
		if l = strings.TrimSpace(l); l != "" {
			return bound(l)
		}
	}
	return ""
}

func bound(s string) string {
	if len(s) <= maxQuoted {
		return s
	}
	cut := maxQuoted
	// Cut at a character's start, not inside it.
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
