// Package move moves a GPU node between nvinject's two paths (the device plugin and
// nvinject-dra) and rolls a driver upgrade through nodes, each as the documented
// procedure done safely: cordon, evict the node's GPU pods through the Eviction API
// (PodDisruptionBudgets respected), the change, wait for the node's owner to publish
// its GPUs again, uncordon. Every step is reported with its time; a node that fails
// stays cordoned with the reason in an annotation.
package move

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/shared/contract"
)

// Annotations nvinject-move leaves on a Node.
const (
	// CordonedBy marks a cordon nvinject-move made, so it never uncordons a node an
	// operator cordoned.
	CordonedBy = "nvinject.io/cordoned-by"
	// Failed holds why the last move or upgrade of the node failed; it stays cordoned.
	Failed  = contract.MoveFailedAnnotation
	program = "nvinject-move"
)

// Step is one step of a move and what it took.
type Step struct {
	Name   string        `json:"name"`
	Took   time.Duration `json:"tookNanoseconds"`
	Detail string        `json:"detail,omitempty"`
}

// Report is what happened to one node.
type Report struct {
	Node string `json:"node"`
	// Action is "move" or "upgrade".
	Action string `json:"action"`
	From   string `json:"from"`
	To     string `json:"to"`
	// NoOp: the node was already there; nothing was changed.
	NoOp   bool   `json:"noOp"`
	DryRun bool   `json:"dryRun,omitempty"`
	Steps  []Step `json:"steps"`
	Error  string `json:"error,omitempty"`
}

// Mover runs moves and upgrades against one cluster.
type Mover struct {
	c           kubernetes.Interface
	log         *slog.Logger
	timeout     time.Duration
	poll        time.Duration
	dryRun      bool
	drainClaims bool
	run         func(ctx context.Context, command, node string) (string, error)
}

// Option configures a Mover.
type Option func(*Mover)

// WithTimeout bounds each waiting step (evictions, the new owner); default 5 minutes.
func WithTimeout(d time.Duration) Option { return func(m *Mover) { m.timeout = d } }

// WithPollInterval sets how often waiting steps look again; default 500 ms.
func WithPollInterval(d time.Duration) Option { return func(m *Mover) { m.poll = d } }

// WithDryRun plans and reports without changing anything.
func WithDryRun() Option { return func(m *Mover) { m.dryRun = true } }

// WithDrainClaims lets a move to the device plugin evict the pods of DRA claims still
// prepared on the node instead of refusing.
func WithDrainClaims() Option { return func(m *Mover) { m.drainClaims = true } }

// WithLogger sets the progress logger.
func WithLogger(l *slog.Logger) Option { return func(m *Mover) { m.log = l } }

// WithCommandRunner replaces how an upgrade's --run command is run (tests).
func WithCommandRunner(f func(ctx context.Context, command, node string) (string, error)) Option {
	return func(m *Mover) { m.run = f }
}

// New returns a Mover on c.
func New(c kubernetes.Interface, opts ...Option) *Mover {
	m := &Mover{c: c, log: slog.Default(), timeout: 5 * time.Minute, poll: 500 * time.Millisecond, run: runShell}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Mode is the node's path: its contract.DRAModeLabel, the device plugin when unset.
func Mode(n *corev1.Node) string {
	if m := n.Labels[contract.DRAModeLabel]; m != "" {
		return m
	}
	return contract.DRAModeDevicePlugin
}

// Move moves node to the path to (contract.DRAModeDevicePlugin or DRAModeDRA).
func (m *Mover) Move(ctx context.Context, node, to string) (Report, error) {
	r := Report{Node: node, Action: "move", To: to, DryRun: m.dryRun}
	if to != contract.DRAModeDevicePlugin && to != contract.DRAModeDRA {
		return r, fmt.Errorf("--to=%q: use %s or %s", to, contract.DRAModeDevicePlugin, contract.DRAModeDRA)
	}
	n, err := m.c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return r, fmt.Errorf("node %s: %w", node, err)
	}
	r.From = Mode(n)
	if r.From == to && !n.Spec.Unschedulable {
		if err := m.ownerReady(ctx, node, to); err == nil {
			r.NoOp = true
			return r, nil
		}
	}
	return m.procedure(ctx, &r, n, func(ctx context.Context) (string, error) {
		if err := m.setMode(ctx, node, to); err != nil {
			return "", err
		}
		return contract.DRAModeLabel + "=" + to, nil
	}, func(ctx context.Context) error {
		if err := m.ownerReady(ctx, node, to); err != nil {
			return err
		}
		return m.oldOwnerGone(ctx, node, to)
	})
}

// Upgrade rolls node to driver version: cordon, evict, run command (with NVINJECT_NODE
// set to the node), wait until its owner publishes version and its GPUs, uncordon.
func (m *Mover) Upgrade(ctx context.Context, node, version, command string) (Report, error) {
	r := Report{Node: node, Action: "upgrade", To: version, DryRun: m.dryRun}
	n, err := m.c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return r, fmt.Errorf("node %s: %w", node, err)
	}
	r.From = n.Labels[contract.GFDLabelDriverVersion]
	mode := Mode(n)
	if r.From == version && !n.Spec.Unschedulable {
		if err := m.ownerReady(ctx, node, mode); err == nil {
			r.NoOp = true
			return r, nil
		}
	}
	return m.procedure(ctx, &r, n, func(ctx context.Context) (string, error) {
		if command == "" {
			return "no --run command: waiting for the driver to change", nil
		}
		out, err := m.run(ctx, command, node)
		if err != nil {
			return "", fmt.Errorf("upgrade command %q: %w: %s", command, err, strings.TrimSpace(out))
		}
		return strings.TrimSpace(lastLine(out)), nil
	}, func(ctx context.Context) error {
		n, err := m.c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := n.Labels[contract.GFDLabelDriverVersion]; got != version {
			return fmt.Errorf("node %s reports driver %q (label %s), want %s", node, got, contract.GFDLabelDriverVersion, version)
		}
		if mode == contract.DRAModeDRA {
			// The slices of the daemon before the restart stay until the new one republishes.
			if err := m.slicesOnDriver(ctx, node, version); err != nil {
				return err
			}
		}
		return m.ownerReady(ctx, node, mode)
	})
}

// procedure runs the safe part every change shares around change, then waits for done.
func (m *Mover) procedure(ctx context.Context, r *Report, n *corev1.Node, change func(context.Context) (string, error), done func(context.Context) error) (Report, error) {
	step := func(name string, f func() (string, error)) error {
		t0 := time.Now()
		detail, err := f()
		s := Step{Name: name, Took: time.Since(t0), Detail: detail}
		if err != nil {
			s.Detail = err.Error()
		}
		r.Steps = append(r.Steps, s)
		m.log.Info("step", "node", r.Node, "step", name, "took", s.Took.Round(time.Millisecond), "detail", s.Detail)
		return err
	}
	wasCordoned := n.Spec.Unschedulable && n.Annotations[CordonedBy] != program
	pods, claims, err := m.gpuPods(ctx, r.Node)
	if err != nil {
		return *r, err
	}
	if m.dryRun {
		r.Steps = append(r.Steps, Step{Name: "plan", Detail: fmt.Sprintf("cordon, evict %d GPU pod(s) %v, %s, wait, uncordon", len(pods), podNames(pods), r.Action)})
		if len(claims) > 0 && r.To == contract.DRAModeDevicePlugin && !m.drainClaims {
			return *r, fmt.Errorf("node %s: DRA claims %v are prepared on it; a move to the device plugin would refuse (or give --drain-claims)", r.Node, claims)
		}
		return *r, nil
	}
	fail := func(err error) (Report, error) {
		r.Error = err.Error()
		m.markFailed(context.WithoutCancel(ctx), r.Node, err)
		return *r, err
	}
	if err := step("cordon", func() (string, error) {
		if wasCordoned {
			return "already cordoned by someone else: it stays cordoned at the end", nil
		}
		return "", m.patchNode(ctx, r.Node, map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{CordonedBy: program, Failed: nil}},
			"spec":     map[string]any{"unschedulable": true},
		})
	}); err != nil {
		return fail(err)
	}
	if r.Action == "move" && r.To == contract.DRAModeDevicePlugin && len(claims) > 0 && !m.drainClaims {
		err := fmt.Errorf("node %s: DRA claims %v are still prepared on it; moving it to the device plugin now would let a device-plugin pod get a GPU a claim holds: let their pods end, or give --drain-claims to evict them", r.Node, claims)
		r.Steps = append(r.Steps, Step{Name: "claims", Detail: err.Error()})
		return fail(err)
	}
	if err := step("evict", func() (string, error) { return m.evict(ctx, pods) }); err != nil {
		return fail(err)
	}
	if r.Action == "move" && r.To == contract.DRAModeDevicePlugin {
		// An evicted pod's claim stays allocated until kubelet unprepares it and the
		// claim controller releases it; the device plugin must not hand out its GPU before.
		if err := step("claims", func() (string, error) { return m.claimsReleased(ctx, r.Node) }); err != nil {
			return fail(err)
		}
	}
	if err := step(r.Action, func() (string, error) { return change(ctx) }); err != nil {
		return fail(err)
	}
	if err := step("wait", func() (string, error) {
		wctx, cancel := context.WithTimeout(ctx, m.timeout)
		defer cancel()
		return "", m.until(wctx, done)
	}); err != nil {
		return fail(err)
	}
	if err := step("uncordon", func() (string, error) {
		if wasCordoned {
			return "left cordoned: it was cordoned before the " + r.Action, nil
		}
		return "", m.patchNode(ctx, r.Node, map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{CordonedBy: nil, Failed: nil}},
			"spec":     map[string]any{"unschedulable": false},
		})
	}); err != nil {
		return fail(err)
	}
	return *r, nil
}

// gpuPods are the node's pods that hold a GPU (an nvidia.com/ resource or a claim),
// never DaemonSet or mirror pods, and the DRA claims reserved on the node.
func (m *Mover) gpuPods(ctx context.Context, node string) ([]corev1.Pod, []string, error) {
	list, err := m.c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, nil, fmt.Errorf("pods on %s: %w", node, err)
	}
	var pods []corev1.Pod
	for _, p := range list.Items {
		if p.Spec.NodeName != node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || ownedByDaemonSet(p) {
			continue
		}
		if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
			continue
		}
		if holdsGPU(p) {
			pods = append(pods, p)
		}
	}
	claims, err := m.c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("resource claims: %w", err)
	}
	var held []string
	for _, c := range claims.Items {
		if c.Status.Allocation == nil || len(c.Status.ReservedFor) == 0 {
			continue
		}
		for _, d := range c.Status.Allocation.Devices.Results {
			if d.Driver == contract.DRADriver && d.Pool == node {
				held = append(held, c.Namespace+"/"+c.Name)
				break
			}
		}
	}
	return pods, held, nil
}

func holdsGPU(p corev1.Pod) bool {
	if len(p.Spec.ResourceClaims) > 0 || p.Status.ExtendedResourceClaimStatus != nil {
		return true
	}
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for r := range c.Resources.Limits {
			if strings.HasPrefix(string(r), contract.CDIVendor+"/") {
				return true
			}
		}
	}
	return false
}

func ownedByDaemonSet(p corev1.Pod) bool {
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// evict evicts pods through the Eviction API, retrying what a PodDisruptionBudget
// refuses until the timeout, and waits until they are gone.
func (m *Mover) evict(ctx context.Context, pods []corev1.Pod) (string, error) {
	if len(pods) == 0 {
		return "no GPU pods", nil
	}
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	for _, p := range pods {
		err := m.until(ctx, func(ctx context.Context) error {
			err := m.c.PolicyV1().Evictions(p.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}})
			if err == nil || apierrors.IsNotFound(err) {
				return nil
			}
			if apierrors.IsTooManyRequests(err) {
				return fmt.Errorf("eviction of %s/%s refused by a PodDisruptionBudget: %w", p.Namespace, p.Name, err)
			}
			return permanent{err}
		})
		if err != nil {
			return "", fmt.Errorf("evict %s/%s: %w; the node stays cordoned: let the budget allow it (scale up elsewhere) and run again", p.Namespace, p.Name, err)
		}
	}
	err := m.until(ctx, func(ctx context.Context) error {
		var left []string
		for _, p := range pods {
			got, err := m.c.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err == nil && got.UID == p.UID {
				left = append(left, p.Namespace+"/"+p.Name)
			} else if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("evicted pods still terminating: %v", left)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d GPU pod(s) evicted: %v", len(pods), podNames(pods)), nil
}

// claimsReleased waits until no DRA claim is allocated from node's devices any more.
func (m *Mover) claimsReleased(ctx context.Context, node string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	err := m.until(ctx, func(ctx context.Context) error {
		_, claims, err := m.gpuPods(ctx, node)
		if err != nil {
			return err
		}
		if len(claims) > 0 {
			return fmt.Errorf("DRA claims %v still allocated on %s after their pods left: check kubelet's and nvinject-dra's logs for a failed unprepare", claims, node)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return "no DRA claim holds a GPU of the node", nil
}

// ownerReady returns nil once the node's owner for mode has a Ready pod on it and the
// node publishes GPUs on that path.
func (m *Mover) ownerReady(ctx context.Context, node, mode string) error {
	app := owner(mode)
	pods, err := m.daemonPods(ctx, node, app)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.DeletionTimestamp == nil && podReady(p) }) {
		return fmt.Errorf("no Ready %s pod on %s", app, node)
	}
	if mode == contract.DRAModeDRA {
		n, err := m.sliceDevices(ctx, node)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%s publishes no devices for %s", contract.DRADriver, node)
		}
		return nil
	}
	if r, _, err := m.allocatable(ctx, node); err != nil || r != "" {
		return err
	}
	return fmt.Errorf("node %s publishes no %s/ resource yet", node, contract.CDIVendor)
}

// oldOwnerGone returns nil once the owner of the other path left the node: its pod,
// for nvinject-dra its ResourceSlices, for the device plugin its resource in kubelet's
// node status.
func (m *Mover) oldOwnerGone(ctx context.Context, node, mode string) error {
	other := contract.DRAModeDRA
	if mode == contract.DRAModeDRA {
		other = contract.DRAModeDevicePlugin
	}
	app := owner(other)
	pods, err := m.daemonPods(ctx, node, app)
	if err != nil {
		return err
	}
	if len(pods) > 0 {
		return fmt.Errorf("old owner %s still has pod %s on %s", app, pods[0].Name, node)
	}
	if mode == contract.DRAModeDevicePlugin {
		n, err := m.sliceDevices(ctx, node)
		if err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%s still publishes %d devices for %s", contract.DRADriver, n, node)
		}
		return nil
	}
	// Until kubelet reports the device plugin's resource gone (its next node status
	// update), the scheduler would place nvidia.com/gpu pods on the device-plugin path
	// and kubelet would refuse them at admission.
	r, q, err := m.allocatable(ctx, node)
	if err != nil {
		return err
	}
	if r != "" {
		return fmt.Errorf("node %s still reports %s allocatable %d from the device plugin", node, r, q)
	}
	return nil
}

// owner is the app of the daemon that owns a node's GPUs in mode.
func owner(mode string) string {
	if mode == contract.DRAModeDRA {
		return contract.DRAApp
	}
	return contract.DevicePluginApp
}

// daemonPods are app's pods on node.
func (m *Mover) daemonPods(ctx context.Context, node, app string) ([]corev1.Pod, error) {
	list, err := m.c.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: contract.AppLabel + "=" + app, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.Spec.NodeName != node }), nil
}

// allocatable is an nvidia.com/ resource node reports allocatable, and how many; ""
// when none.
func (m *Mover) allocatable(ctx context.Context, node string) (string, int64, error) {
	n, err := m.c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", 0, err
	}
	for r, q := range n.Status.Allocatable {
		if strings.HasPrefix(string(r), contract.CDIVendor+"/") && q.Value() > 0 {
			return string(r), q.Value(), nil
		}
	}
	return "", 0, nil
}

// slicesOnDriver returns nil once every device node's slices publish has version as
// its driverVersion attribute.
func (m *Mover) slicesOnDriver(ctx context.Context, node, version string) error {
	list, err := m.c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node + ",spec.driver=" + contract.DRADriver})
	if err != nil {
		return err
	}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			a, ok := d.Attributes[contract.DRAAttrDriverVersion]
			want, _ := contract.DRASemVer(version)
			if got := ""; !ok || a.VersionValue == nil || *a.VersionValue != want {
				if ok && a.VersionValue != nil {
					got = *a.VersionValue
				}
				return fmt.Errorf("ResourceSlice %s device %s still publishes driver %q, want %s", s.Name, d.Name, got, version)
			}
		}
	}
	return nil
}

func (m *Mover) sliceDevices(ctx context.Context, node string) (int, error) {
	slices, err := m.c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node + ",spec.driver=" + contract.DRADriver})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range slices.Items {
		if s.Spec.NodeName != nil && *s.Spec.NodeName == node && s.Spec.Driver == contract.DRADriver {
			n += len(s.Spec.Devices)
		}
	}
	return n, nil
}

func (m *Mover) setMode(ctx context.Context, node, mode string) error {
	return m.patchNode(ctx, node, map[string]any{"metadata": map[string]any{"labels": map[string]any{contract.DRAModeLabel: mode}}})
}

func (m *Mover) patchNode(ctx context.Context, node string, patch map[string]any) error {
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := m.c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: program}); err != nil {
		return fmt.Errorf("patch node %s: %w", node, err)
	}
	return nil
}

// markFailed leaves the reason on the node, bounded, for the next operator.
func (m *Mover) markFailed(ctx context.Context, node string, cause error) {
	reason := cause.Error()
	if len(reason) > 512 {
		reason = reason[:512] + "…"
	}
	if err := m.patchNode(ctx, node, map[string]any{"metadata": map[string]any{"annotations": map[string]any{Failed: reason}}}); err != nil {
		m.log.Error("could not record the failure on the node", "node", node, "err", err)
	}
}

// permanent ends until's retries.
type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

// until retries check until it succeeds, fails permanently or ctx ends.
func (m *Mover) until(ctx context.Context, check func(context.Context) error) error {
	for {
		err := check(ctx)
		var p permanent
		if err == nil || errors.As(err, &p) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out: %w", err)
		case <-time.After(m.poll):
		}
	}
}

func podReady(p corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podNames(pods []corev1.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Namespace + "/" + p.Name
	}
	return out
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// runShell runs command with sh -c and NVINJECT_NODE=node.
func runShell(ctx context.Context, command, node string) (string, error) {
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Env = append(os.Environ(), "NVINJECT_NODE="+node)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
