// Package plugin is the NRI plugin's handler: it decides, per container,
// which GPU edits to apply and whether the container as it will run gets
// exactly its GPUs. One request per container (request.go), kept from
// CreateContainer (handler.go) for the check of the final container
// (validate.go, final.go); which pod holds which GPU (holders.go); the
// audit record's findings (record.go); the request deadline (deadline.go).
package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/collect"
	"github.com/nvinject/nvinject/nri/internal/convert"
	"github.com/nvinject/nvinject/nri/internal/ledger"
	"github.com/nvinject/nvinject/nri/internal/metrics"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/podresources"
)

// UUIDsKey is the container annotation recording the injected GPU UUIDs.
const UUIDsKey = contract.GPUUUIDsAnnotation

// DefaultRequestDeadline is how long one request may take before the plugin
// refuses the container itself: well inside containerd's default
// plugin_request_timeout (2s), after which the runtime would skip the plugin.
const DefaultRequestDeadline = time.Second

// Resolver resolves CDI names to edits.
type Resolver interface {
	Resolve(names []string, user oci.User) (resolve.Result, error)
	Device(name string) (resolve.Device, bool)
}

// Kubelet reports what kubelet's PodResources assigned the containers of
// every pod it lists, in one List call: device-plugin devices and DRA
// claims. It is the handler's one lookup of kubelet's word, claims
// included, so one List serves both paths and the check for other pods
// holding the GPU. shared/podresources' client satisfies it.
type Kubelet interface {
	List(ctx context.Context) ([]podresources.Pod, error)
}

// Auditor takes the record of every verdict on a GPU container. It must
// not block: it is called on the request path.
type Auditor interface{ Record(audit.Record) }

// Refusal reasons that are not a verify.Reason.
const (
	ReasonBadRequest   = "invalid-request"
	ReasonRuntimeClass = "runtime-class"
	ReasonPodLevel     = "pod-annotation"
	ReasonUnresolvable = "unresolvable"
	ReasonSpec         = "spec-error"
	ReasonKubeletDown  = "podresources-unavailable"
	ReasonDeadline     = "deadline"
	// ReasonHeld: another live pod holds the container's GPU.
	ReasonHeld = "gpu-held"
)

// RefusalError is a refused container creation; Reason labels the metric.
type RefusalError struct {
	Reason string
	Err    error
}

func (e *RefusalError) Error() string {
	return contract.Bound(fmt.Errorf("nvinject: %w", e.Err)).Error()
}
func (e *RefusalError) Unwrap() error { return e.Err }

func refuse(reason string, err error) error { return &RefusalError{Reason: reason, Err: err} }

// Handler decides, per container, which GPU edits to apply and checks them.
type Handler struct {
	log       *slog.Logger
	collector *collect.Collector
	resolver  Resolver
	kubelet   Kubelet
	metrics   *metrics.Metrics
	auditor   Auditor
	verdicts  Auditor
	handlers  map[string]bool
	vendor    string
	class     string
	resource  string
	inventory *verify.Inventory
	invMu     sync.Mutex
	refresh   InventoryRefresh
	refreshed time.Time
	deadline  time.Duration
	// inflight counts requests still running after their deadline refused them.
	inflight sync.WaitGroup
	ledger   ledger.Ledger
	requests requests
}

// Option configures a Handler.
type Option func(*Handler)

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(h *Handler) { h.log = l } }

// WithKubelet makes every check also compare with kubelet's PodResources
// and refuse a GPU another pod holds there.
func WithKubelet(k Kubelet) Option { return func(h *Handler) { h.kubelet = k } }

// WithMetrics sets where outcomes are counted.
func WithMetrics(m *metrics.Metrics) Option { return func(h *Handler) { h.metrics = m } }

// WithVerdictLog hands each verdict's log line to l (an audit.Log that
// writes it off the request path); without it the line is written before
// the answer.
func WithVerdictLog(l Auditor) Option { return func(h *Handler) { h.verdicts = l } }

// WithAuditor sends the record of each verdict on a GPU container to a,
// besides the log line.
func WithAuditor(a Auditor) Option { return func(h *Handler) { h.auditor = a } }

// WithRuntimeHandlers sets the runtime handlers served (default "nvidia").
func WithRuntimeHandlers(names ...string) Option {
	return func(h *Handler) {
		h.handlers = map[string]bool{}
		for _, n := range names {
			h.handlers[n] = true
		}
	}
}

// WithKind sets the CDI vendor and class of nvinject's GPUs.
func WithKind(vendor, class string) Option {
	return func(h *Handler) { h.vendor, h.class = vendor, class }
}

// WithResourceName sets the extended resource whose kubelet assignment is
// compared (default "nvidia.com/gpu").
func WithResourceName(r string) Option { return func(h *Handler) { h.resource = r } }

// WithInventory sets the node's GPUs and MIG devices discovered at start.
func WithInventory(inv *verify.Inventory) Option { return func(h *Handler) { h.inventory = inv } }

// WithRequestDeadline sets how long CreateContainer and the validation may
// take before the plugin refuses the container (default
// DefaultRequestDeadline). Keep it well below the runtime's
// plugin_request_timeout: a plugin that overruns that is skipped.
func WithRequestDeadline(d time.Duration) Option { return func(h *Handler) { h.deadline = d } }

// NewHandler returns a Handler.
func NewHandler(c *collect.Collector, r Resolver, opts ...Option) *Handler {
	h := &Handler{
		log: slog.Default(), collector: c, resolver: r, deadline: DefaultRequestDeadline,
		handlers: map[string]bool{contract.RuntimeHandler: true}, vendor: contract.CDIVendor, class: contract.CDIClass, resource: contract.ResourceName,
	}
	for _, o := range opts {
		o(h)
	}
	return h
}

// outcome is what one container gets; rec is what a refusal records and
// req what the check of the final container takes over.
type outcome struct {
	adj   *api.ContainerAdjustment
	uuids []string
	rec   audit.Record
	req   *request
}

// CreateContainer applies the container's GPU edits, or refuses it. The
// UUID check of the container as it will run is ValidateContainerAdjustment.
func (h *Handler) CreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return h.CreateContainerAfter(ctx, nil, pod, ctr)
}

// CreateContainerAfter is CreateContainer with hold run first for a pod of
// a served runtime handler (the pods with GPU work), under the same
// request deadline: what holds the request up counts against it as the
// handler's own work would. The simulation's delay route uses it to play
// a slow plugin.
func (h *Handler) CreateContainerAfter(ctx context.Context, hold func(context.Context), pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	start := time.Now()
	out, err := within(ctx, h, "CreateContainer", func(ctx context.Context) (outcome, error) {
		if hold != nil && h.handlers[pod.GetRuntimeHandler()] {
			hold(ctx)
			if ctx.Err() != nil {
				return outcome{}, refuse(ReasonDeadline, fmt.Errorf("held up before the GPU work: %w", ctx.Err()))
			}
		}
		return h.create(ctx, pod, ctr)
	})
	if h.metrics != nil {
		h.metrics.Observe(time.Since(start))
	}
	if err != nil {
		h.refused(pod, ctr, out.rec, err)
		return nil, nil, err
	}
	if out.req != nil {
		h.requests.put(ctr.GetId(), out.req)
	}
	if len(out.uuids) > 0 {
		h.log.Debug("adjusting GPU container; the check of the final container follows", append(h.attrs(pod, ctr), "uuids", out.uuids)...)
	}
	return out.adj, nil, nil
}

func (h *Handler) attrs(pod *api.PodSandbox, ctr *api.Container) []any {
	return []any{"pod", pod.GetNamespace() + "/" + pod.GetName(), "container", ctr.GetName(), "runtime_handler", pod.GetRuntimeHandler()}
}

// refused is the final verdict on a refused container: counted, logged
// with its record and audited.
func (h *Handler) refused(pod *api.PodSandbox, ctr *api.Container, rec audit.Record, err error) {
	reason := reasonOf(err)
	if h.metrics != nil {
		h.metrics.Refused(reason)
	}
	rec.Reason, rec.Error = reason, err.Error()
	h.verdict(pod, ctr, rec)
}

// admitted is the final verdict on a GPU container given uuids.
func (h *Handler) admitted(pod *api.PodSandbox, ctr *api.Container, rec audit.Record, uuids []string) {
	if h.metrics != nil {
		h.metrics.Injected()
	}
	rec.Admitted, rec.UUIDs = true, uuids
	h.verdict(pod, ctr, rec)
}

// verdict logs the record as the one line of the verdict and audits it.
func (h *Handler) verdict(pod *api.PodSandbox, ctr *api.Container, rec audit.Record) {
	rec.Namespace, rec.Pod, rec.PodUID, rec.Container, rec.RuntimeHandler = pod.GetNamespace(), pod.GetName(), pod.GetUid(), ctr.GetName(), pod.GetRuntimeHandler()
	rec = rec.Bounded()
	if h.verdicts != nil {
		h.verdicts.Record(rec)
	} else {
		audit.WriteLine(h.log, rec)
	}
	if h.auditor != nil {
		h.auditor.Record(rec)
	}
}

// notAsked is why a record names no kubelet assignment when the verdict
// came before kubelet was asked.
const notAsked = "the verdict came before kubelet was asked"

func (h *Handler) create(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (outcome, error) {
	r, err := h.build(ctx, pod, ctr)
	out := outcome{rec: h.record(r)}
	if err != nil {
		return out, err
	}
	if !h.handlers[pod.GetRuntimeHandler()] {
		if ours := h.ours(slices.Concat(r.names, h.collector.AnyCDI(ctr))); len(ours) > 0 {
			out.rec.CDI = ours
			return out, refuse(ReasonRuntimeClass, fmt.Errorf("%s requests %s but runs with runtime handler %q; set runtimeClassName: %s in the pod spec",
				r.who, contract.List(ours), pod.GetRuntimeHandler(), h.servedHint()))
		}
		return outcome{}, nil
	}
	adj := &api.ContainerAdjustment{}
	if len(r.names) > 0 {
		if adj, err = convert.Adjustment(r.res.Spec, ctr); err != nil {
			return out, refuse(ReasonSpec, fmt.Errorf("%s: %w", r.who, err))
		}
	}
	// An early check of what nvinject itself hands out, for a clear
	// refusal; kubelet and the other plugins' adjustments are checked in
	// ValidateContainerAdjustment.
	final := finalOf(ctr, adj)
	in := verify.Input{Allocated: r.gpus, Nodes: final.nodes(), Env: final.env}
	if err := h.verifyInput(ctx, in); err != nil {
		out.rec.Checked, out.rec.Devices, out.rec.Env = true, gpuNodes(in.Nodes), uuidEnv(in.Env)
		return out, refuse(reasonOf(err), fmt.Errorf("%s: %w", r.who, err))
	}
	uuids := verify.UUIDs(r.gpus)
	if len(uuids) > 0 {
		adj.AddAnnotation(UUIDsKey, strings.Join(uuids, ","))
	}
	if isEmpty(adj) {
		adj = nil
	}
	return outcome{adj: adj, uuids: uuids, req: r}, nil
}

// Synchronize reports the GPU containers already running and whether they
// pass the check; it changes nothing.
func (h *Handler) Synchronize(ctx context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	byID := make(map[string]*api.PodSandbox, len(pods))
	for _, p := range pods {
		byID[p.GetId()] = p
	}
	pass, fail := 0, 0
	running := map[string]ledger.Holder{}
	for _, ctr := range ctrs {
		pod := byID[ctr.GetPodSandboxId()]
		if pod == nil || !h.handlers[pod.GetRuntimeHandler()] {
			continue
		}
		gpus, err := h.check(ctx, ctr)
		uuids := verify.UUIDs(gpus)
		// What runs holds its GPUs, passing the check or not; events missed
		// while disconnected are caught up here.
		if held := recordedUUIDs(ctr, uuids); len(held) > 0 && ctr.GetState() != api.ContainerState_CONTAINER_STOPPED {
			running[ctr.GetId()] = holderOf(pod, ctr, h.units(held, gpus, h.runningShares(ctr)))
		}
		attrs := []any{"pod", pod.GetNamespace() + "/" + pod.GetName(), "container", ctr.GetName(), "state", ctr.GetState().String()}
		switch {
		case err != nil:
			fail++
			h.log.Warn("running container fails the GPU check", append(attrs, "error", err.Error())...)
		case len(uuids) > 0:
			pass++
			h.log.Info("running GPU container passes the check", append(attrs, "uuids", contract.List(uuids))...)
		}
	}
	h.ledger.Reset(running)
	h.requests.reset()
	if h.metrics != nil {
		h.metrics.Running(pass, fail)
	}
	h.log.Info("synchronized with runtime", "containers", len(ctrs), "gpu_containers_passing", pass, "gpu_containers_failing", fail, "gpu_containers_holding", len(running))
	return nil, nil
}

// check verifies a container as it already is (no adjustment), returning
// the units its CDI names stand for.
func (h *Handler) check(ctx context.Context, ctr *api.Container) ([]verify.GPU, error) {
	names, err := h.collector.Container(ctr)
	if err != nil {
		return nil, err
	}
	_, gpus, err := h.resolve(names, ctr)
	if err != nil {
		return nil, err
	}
	final := finalOf(ctr, nil)
	in := verify.Input{Allocated: gpus, Nodes: final.nodes(), Env: final.env}
	return gpus, h.verifyInput(ctx, in)
}

// ours returns the sorted distinct names of nvinject's CDI kind.
func (h *Handler) ours(names []string) []string {
	ours := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !contract.IsKind(n, h.vendor, h.class) })
	return slices.Compact(slices.Sorted(slices.Values(ours)))
}

func (h *Handler) servedHint() string {
	if h.handlers[contract.RuntimeHandler] || len(h.handlers) == 0 {
		return contract.RuntimeHandler
	}
	return strings.Join(slices.Sorted(maps.Keys(h.handlers)), " or ")
}

func isEmpty(a *api.ContainerAdjustment) bool {
	return len(a.GetAnnotations()) == 0 && len(a.GetEnv()) == 0 && len(a.GetMounts()) == 0 &&
		a.GetHooks() == nil && len(a.GetLinux().GetDevices()) == 0
}

func reasonOf(err error) string {
	var r *RefusalError
	if errors.As(err, &r) {
		return r.Reason
	}
	var m *verify.MismatchError
	if errors.As(err, &m) {
		return string(m.Reason)
	}
	return ReasonSpec
}
