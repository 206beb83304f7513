// Package gpunode is the GPU node both kubelet plugins serve, and its one
// lifecycle: the metrics and health endpoints, NVML opened with the one
// retry policy, the GPUs discovered and selected, the node's one CDI spec
// written, their health tracked with its checkpoint, reported at most
// once per --health-update-interval and recovered on SIGHUP. The plugin's
// own protocol then runs over the GPUs (Serve), and NVML is closed only
// after the health watch and the protocol have returned.
//
// The Node is product; it knows nothing of the simulation. Under
// --nvml=sim:... New bolts the simulation's seam (gpunode/simdebug) on
// through the Node's generic options (simulation.go, the one place): the
// seam opens the simulated NVML, serves its fault routes and learns the
// published GPUs' health tracker.
package gpunode

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/cdi/driver"
	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/gpunode/health/coalesce"
	"github.com/nvinject/nvinject/gpunode/mps"
	"github.com/nvinject/nvinject/gpunode/nodeconfig"
	"github.com/nvinject/nvinject/gpunode/nodelabels"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/httpserve"
	"github.com/nvinject/nvinject/shared/logging"
	"github.com/nvinject/nvinject/shared/sharing"
)

// OpenFunc opens NVML: backend.Open, the simulation's seam, or a test's
// simulated node.
type OpenFunc func(nvml string, o backend.Options) (*backend.Backend, error)

// GPUs is what the node hands a plugin's protocol.
type GPUs struct {
	Node gpu.Node
	// Published are the selected GPUs, in publication order.
	Published []gpu.Device
	// CDIName maps a GPU UUID to its device in the node's CDI spec.
	CDIName func(uuid string) string
	Health  *health.Tracker
	// Reported is Health as the plugin reports it to the API server (the
	// device list, the ResourceSlice): at most one change per
	// --health-update-interval. What refuses a GPU reads Health.
	Reported *health.Reported
	// Sharing is the time-slicing configuration the spec was written with
	// (WithSharing); empty shares nothing.
	Sharing sharing.Config
	// MPS runs the MPS daemons of a plugin that shares by claim
	// (WithClaimMPS); nil otherwise.
	MPS *ClaimMPS
	// MIG makes MIG devices on demand (WithMIGOnDemand); nil otherwise.
	MIG *MIGOnDemand

	// labels are the node's GPU labels for these GPUs (WithNodeLabels).
	labels map[string]string
	// specPath is the node's CDI spec file for these GPUs.
	specPath string
}

// ClaimMPS runs the MPS control daemons a plugin declares (nvinject-dra:
// one per claim shared through MPS) from the node's driver root.
type ClaimMPS struct {
	m       *mps.Manager
	prog    mps.Program
	progErr error
	host    string
}

// Sync runs exactly ds; the error says why none can run (the driver root
// has no MPS control program).
func (c *ClaimMPS) Sync(ds []mps.Daemon) error {
	if c.progErr != nil && len(ds) > 0 {
		return c.progErr
	}
	c.m.Sync(c.prog, ds)
	return nil
}

// Wait returns once daemon id listens with its limits set; the error says
// why not when ctx ends.
func (c *ClaimMPS) Wait(ctx context.Context, id string) error { return c.m.Wait(ctx, id) }

// Client is the host paths a client of daemon id mounts: its pipe
// directory and the daemons' shared memory.
func (c *ClaimMPS) Client(id string) (pipe, shm string) {
	return mps.PathsOf(c.host, id).Pipe, mps.ShmDir(c.host)
}

// UUIDs are the published GPUs' UUIDs, in publication order.
func (g GPUs) UUIDs() []string {
	out := make([]string, len(g.Published))
	for i, d := range g.Published {
		out[i] = d.UUID
	}
	return out
}

// Serve is a plugin's protocol over the node's GPUs. It runs until ctx
// ends and returns once everything it started has; an error ends the node.
type Serve func(ctx context.Context, g GPUs) error

// HealthMetrics names the health collectors the node keeps for the plugin:
// the same series under each plugin's own names.
type HealthMetrics struct {
	// Events counts NVML health events by kind, xid and ignored.
	Events string
	// Healthy is 1 per Healthy GPU, 0 per Unhealthy one, by uuid and
	// DeviceLabel (the GPU's name in the plugin's protocol, DeviceID).
	Healthy     string
	HealthyHelp string
	DeviceLabel string
	DeviceID    func(gpu.Device) string
	// Coalesced counts health changes never reported because a newer one
	// replaced them within --health-update-interval.
	Coalesced string
}

// Node is one plugin process's GPU node.
type Node struct {
	cfg       nodeconfig.Config
	log       *slog.Logger
	open      OpenFunc
	recover   <-chan os.Signal
	nvmlRetry time.Duration
	ready     func() error
	names     HealthMetrics
	routes    map[string]http.Handler
	onPublish []func(GPUs)
	sharing   sharing.Config
	claimMPS  bool
	mpsDir    string
	mpsHost   string
	mps       *mps.Manager
	labels    *nodelabels.Publisher
	// migOwned are the MIG devices the plugin made (WithMIGOnDemand).
	migOwned func(parent string, at gpu.MIGPlacement) bool

	reg       *prometheus.Registry
	events    *prometheus.CounterVec
	healthy   *prometheus.GaugeVec
	coalesced prometheus.Counter
	// republishes counts rounds started for a changed MIG layout.
	republishes prometheus.Counter
	// state is why the node is not ready: NVML not open yet, or failing.
	state *httpserve.Readiness
}

// Option configures a Node.
type Option func(*Node)

// WithOpen replaces how NVML is opened (tests keep the simulated node),
// the simulation's seam's opener included.
func WithOpen(f OpenFunc) Option { return func(n *Node) { n.open = f } }

// WithRoutes adds handlers, by pattern, to the metrics address. They are
// served from the start, before NVML is open, and must answer on their own
// until then (the simulation's fault routes answer 503).
func WithRoutes(routes map[string]http.Handler) Option {
	return func(n *Node) {
		if n.routes == nil {
			n.routes = map[string]http.Handler{}
		}
		for p, h := range routes {
			n.routes[p] = h
		}
	}
}

// WithOnPublish calls f with the GPUs once they are published and their
// health tracker made, before health tracking and the protocol start (the
// simulation's seam learns the tracker; tests keep it).
func WithOnPublish(f func(GPUs)) Option {
	return func(n *Node) { n.onPublish = append(n.onPublish, f) }
}

// WithSharing shares the published resources as c says: the CDI spec
// records each shared device's replicas, and the plugin gets c to publish
// them (the device plugin's time-slicing).
func WithSharing(c sharing.Config) Option { return func(n *Node) { n.sharing = c } }

// WithClaimMPS lets the plugin run MPS control daemons of its own through
// GPUs.MPS (nvinject-dra, per claim); the node then runs none from a
// sharing configuration.
func WithClaimMPS() Option { return func(n *Node) { n.claimMPS = true } }

// WithRecoverSignal asks NVML about every GPU, and clears the Xid and loss
// marks of those it vouches for, on each receive (SIGHUP).
func WithRecoverSignal(ch <-chan os.Signal) Option { return func(n *Node) { n.recover = ch } }

// WithNVMLRetry sets how often NVML is tried again under
// --on-nvml-error=wait (default 10 s; tests shorten it).
func WithNVMLRetry(d time.Duration) Option { return func(n *Node) { n.nvmlRetry = d } }

// WithReady adds the protocol's readiness: /readyz and Ready report it
// once the node itself is ready.
func WithReady(f func() error) Option { return func(n *Node) { n.ready = f } }

// WithHealthMetrics names the health collectors (default: none exported).
func WithHealthMetrics(m HealthMetrics) Option { return func(n *Node) { n.names = m } }

// checkpointFile is the health checkpoint's name in --state-dir.
const checkpointFile = "health.json"

// New returns the node for cfg: under --nvml=sim:... with the
// simulation's seam (simulation.go), which opts may override (WithOpen).
// The plugin registers its own collectors on Registry before Run.
func New(cfg nodeconfig.Config, log *slog.Logger, opts ...Option) *Node {
	n := &Node{cfg: cfg, log: log, open: backend.Open, nvmlRetry: 10 * time.Second, ready: func() error { return nil },
		reg: prometheus.NewRegistry(), state: httpserve.NewReadiness("starting"), mpsDir: cfg.MPSDir, mpsHost: cmp.Or(cfg.HostMPSDir, cfg.MPSDir)}
	for _, o := range append(simulation(cfg.NVML), opts...) {
		o(n)
	}
	if n.claimMPS || len(n.sharing.Sharing.MPS.Resources) > 0 {
		n.mps = mps.New(n.mpsDir, mps.WithLogger(log))
	}
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if n.names.Events != "" {
		n.events = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: n.names.Events, Help: "NVML health events received, by kind (xid, gpu-lost), Xid and whether policy ignored them.",
		}, []string{"kind", "xid", "ignored"})
		n.healthy = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: n.names.Healthy, Help: n.names.HealthyHelp}, []string{"uuid", n.names.DeviceLabel})
		n.reg.MustRegister(n.events, n.healthy)
	}
	if n.names.Coalesced != "" {
		n.coalesced = prometheus.NewCounter(prometheus.CounterOpts{
			Name: n.names.Coalesced, Help: "GPU health changes not reported to the API server because a newer one replaced them within --health-update-interval.",
		})
		n.reg.MustRegister(n.coalesced)
	}
	return n
}

// Registry is where the plugin registers its own collectors.
func (n *Node) Registry() prometheus.Registerer { return n.reg }

// Ready is nil once NVML is open and the protocol is ready, else why not.
func (n *Node) Ready() error {
	if err := n.state.Ready(); err != nil {
		return err
	}
	if n.mps != nil {
		if err := n.mps.Ready(); err != nil {
			return err
		}
	}
	return n.ready()
}

// Run serves the metrics and health endpoints and the node until ctx ends
// or a part fails, and returns the first failure: bad GPU selection, CDI
// spec failure, NVML missing with --on-nvml-error=exit, the metrics address
// taken, or serve's error. Every goroutine it starts has ended when it
// returns.
func (n *Node) Run(ctx context.Context, serve Serve) error {
	web := httpserve.New(n.cfg.MetricsAddr, n.reg, httpserve.WithLogger(n.log), httpserve.WithReady(n.Ready))
	for pattern, h := range n.routes {
		web.Handle(pattern, h)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return web.Run(ctx) })
	if n.mps != nil {
		// The daemons outlive a publish round: their clients keep running.
		g.Go(func() error { return n.mps.Run(ctx) })
	}
	g.Go(func() error { return n.serveNVML(ctx, serve) })
	return g.Wait()
}

// serveNVML opens NVML, publishes, and closes NVML once publishing ended.
func (n *Node) serveNVML(ctx context.Context, serve Serve) error {
	b, err := n.openNVML(ctx)
	if err != nil || b == nil {
		return err
	}
	n.state.SetReady()
	err = n.publish(ctx, b, serve)
	if cerr := b.Close(); cerr != nil {
		n.log.Warn("closing NVML failed", logging.Err(cerr))
	}
	return err
}

// openNVML opens the backend; on failure it exits or waits as configured.
// A nil backend with a nil error means ctx ended while waiting.
func (n *Node) openNVML(ctx context.Context) (*backend.Backend, error) {
	for {
		b, err := n.open(n.cfg.NVML, backend.Options{DriverRoot: n.cfg.DriverRoot, DevRoot: n.cfg.DevRoot, Logger: n.log})
		if err == nil {
			return b, nil
		}
		err = fmt.Errorf("cannot open NVML (--nvml=%s): %w", n.cfg.NVML, err)
		if n.cfg.OnNVMLError == nodeconfig.OnNVMLErrorExit {
			return nil, err
		}
		n.state.SetNotReady(err.Error())
		n.log.Error("NVML unavailable; no GPUs published, retrying (set --on-nvml-error=exit to fail instead)", logging.Err(err), "retry_in", n.nvmlRetry)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(n.nvmlRetry):
		}
	}
}

// publish discovers and selects the GPUs and runs rounds over them (one
// per MIG layout, relayout.go) until ctx ends or serve returns; it returns
// after everything a round started did.
func (n *Node) publish(ctx context.Context, b *backend.Backend, serve Serve) error {
	seen, err := b.MIGLayout(ctx)
	if err != nil {
		return fmt.Errorf("read the MIG layout: %w", err)
	}
	node, err := b.Discover(ctx)
	if err != nil {
		return fmt.Errorf("discover GPUs: %w", err)
	}
	var prev *health.Tracker
	for {
		gpus, err := n.prepare(node, prev)
		if err != nil {
			n.withdrawLabels(ctx)
			return err
		}
		if n.migOwned != nil {
			gpus.MIG = &MIGOnDemand{n: n, b: b}
		}
		n.state.SetReady()
		next, err := n.round(ctx, b, gpus, seen, serve)
		if err != nil || next == nil {
			return err
		}
		n.republished(gpus, next.gpus)
		node, seen, prev = next.node, next.layout, gpus.Health
	}
}

// prepare writes the CDI spec of node's selected GPUs and makes their
// health tracker, carrying prev's marks (the round before).
func (n *Node) prepare(node gpu.Node, prev *health.Tracker) (GPUs, error) {
	p, err := n.plan(node)
	if err != nil {
		return GPUs{}, err
	}
	for _, s := range p.skipped {
		n.log.Warn("GPU not published", "uuid", s.Device.UUID, "reason", s.Reason)
	}
	path, changed, err := spec.Write(n.cfg.CDISpecDir, p.spec)
	if err != nil {
		return GPUs{}, fmt.Errorf("write the CDI spec: %w; check that --cdi-spec-dir is writable", err)
	}
	n.log.Info("CDI spec ready", "path", path, "rewritten", changed, "gpus", len(p.published))

	gpus := GPUs{Node: node, Published: p.published, CDIName: p.gen.QualifiedName, Sharing: n.sharing, specPath: path}
	mpsNow := len(p.shares.mps) > 0
	switch {
	case n.claimMPS:
		// A driver root without MPS refuses MPS claims, not the node.
		prog, err := n.mpsProgram(node)
		gpus.MPS = &ClaimMPS{m: n.mps, prog: prog, progErr: err, host: n.mpsHost}
		mpsNow = err == nil
	case n.mps != nil:
		prog, err := n.mpsProgram(node)
		if err != nil {
			return GPUs{}, err
		}
		n.mps.Sync(prog, p.shares.daemons)
	}
	gpus.labels = n.computeLabels(gpus, mpsNow)
	gpus.Health = n.newTracker(gpus, prev)
	gpus.Reported = n.newReported(gpus.Health)
	for _, f := range n.onPublish {
		f(gpus)
	}
	return gpus, nil
}

// publication is what publishing a node's GPUs would be, before anything
// is written: the selection and the CDI spec.
type publication struct {
	published []gpu.Device
	skipped   []gpuselect.Skipped
	gen       *spec.Generator
	spec      *specs.Spec
	shares    shares
}

// plan selects node's GPUs (NVIDIA_VISIBLE_DEVICES, MIG_STRATEGY) and
// generates their CDI spec, with no side effect: a layout it refuses is
// refused at start and at a republish alike.
func (n *Node) plan(node gpu.Node) (publication, error) {
	var p publication
	var err error
	p.published, p.skipped, err = gpuselect.Select(node.Devices, n.cfg.Selector, n.cfg.MIGStrategy)
	if err != nil {
		return p, err
	}
	if len(p.published) == 0 {
		return p, fmt.Errorf("no GPU to publish: NVIDIA_VISIBLE_DEVICES=%s selects none of the node's %d GPUs; set it (ConfigMap key %s) to a GPU UUID, index or all", contract.Quote(n.cfg.VisibleDevices), len(node.Devices), contract.ConfigMapKey)
	}
	// The node's one CDI spec: the same generator and file on either path,
	// so nvinject-nri and containerd resolve the same names.
	if p.shares, err = n.shares(p.published); err != nil {
		return p, err
	}
	opts := []spec.Option{spec.WithVendor(n.cfg.CDIVendor), spec.WithClass(n.cfg.CDIClass), spec.WithDriverRoot(n.cfg.DriverRoot), spec.WithHostDriverRoot(n.cfg.HostDriverRoot), spec.WithHookBinary(n.cfg.HookBinary), spec.WithSharedReplicas(p.shares.replicas), spec.WithMPS(p.shares.mps)}
	if n.migOwned != nil {
		opts = append(opts, spec.WithMIGOnDemand())
	}
	p.gen = spec.New(opts...)
	if p.spec, err = p.gen.Generate(node, p.published); err != nil {
		return p, fmt.Errorf("generate the CDI spec: %w", err)
	}
	return p, nil
}

// shares are how the published GPUs are shared: each shared GPU's or MIG
// device's replicas, and for those shared through MPS their clients' edits
// and their control daemons.
type shares struct {
	replicas map[string]int
	mps      map[string]spec.MPSShare
	daemons  []mps.Daemon
}

// shares maps each shared GPU or MIG device to its replicas (and MPS
// share), by the resources the published GPUs form under the MIG strategy.
func (n *Node) shares(published []gpu.Device) (shares, error) {
	if !n.sharing.Any() {
		return shares{}, nil
	}
	resources, err := gpuselect.Resources(published, n.cfg.MIGStrategy, n.cfg.ResourceName)
	if err != nil {
		return shares{}, err
	}
	out := shares{replicas: map[string]int{}, mps: map[string]spec.MPSShare{}}
	var names []string
	for _, r := range resources {
		names = append(names, r.Name)
		rep, ok := n.sharing.For(r.Name)
		if !ok {
			continue
		}
		for _, u := range r.Units {
			out.replicas[u.UUID()] = rep.Replicas
			if rep.Strategy != sharing.MPSShared {
				continue
			}
			// Each replica's share: NVIDIA's device plugin divides threads
			// and memory evenly among a GPU's replicas.
			d := mps.Daemon{ID: u.UUID(), Visible: u.UUID(), ActiveThreadPercentage: 100 / rep.Replicas, PinnedMemoryMiB: unitMemory(u) >> 20 / uint64(rep.Replicas)}
			out.daemons = append(out.daemons, d)
			out.mps[u.UUID()] = spec.MPSShare{PipeDir: mps.PathsOf(n.mpsHost, d.ID).Pipe, ShmDir: mps.ShmDir(n.mpsHost),
				ActiveThreadPercentage: d.ActiveThreadPercentage, PinnedMemoryMiB: d.PinnedMemoryMiB}
		}
		n.log.Info("resource shared", "resource", r.Name, "strategy", rep.Strategy, "published_as", rep.Name, "replicas", rep.Replicas, "devices", len(r.Units))
	}
	if unused := n.sharing.Unused(names); len(unused) > 0 {
		n.log.Warn("sharing configuration names resources this node does not publish; nothing of theirs is shared", "resources", unused, "published", names)
	}
	return out, nil
}

func unitMemory(u gpuselect.Unit) uint64 {
	if u.MIG != nil {
		return u.MIG.MemoryBytes
	}
	return u.GPU.MemoryBytes
}

// mpsProgram is the driver root's MPS control program, with its libraries
// on the loader's path.
func (n *Node) mpsProgram(node gpu.Node) (mps.Program, error) {
	files, err := driver.Find(n.cfg.DriverRoot, node.DriverVersion, node.DriverSource)
	if err != nil {
		return mps.Program{}, err
	}
	var dirs []string
	for _, d := range files.LibDirs() {
		dirs = append(dirs, filepath.Join(n.cfg.DriverRoot, d))
	}
	for _, b := range files.Binaries {
		if filepath.Base(b.Path) == mps.ControlBinary {
			return mps.Program{Path: filepath.Join(n.cfg.DriverRoot, b.Source), Env: []string{"LD_LIBRARY_PATH=" + strings.Join(dirs, ":")}}, nil
		}
	}
	return mps.Program{}, fmt.Errorf("the sharing configuration shares GPUs through MPS, but driver root %s has no %s; install NVIDIA's MPS binaries there (Debian: nvidia-cuda-mps) or share by time-slicing", n.cfg.DriverRoot, mps.ControlBinary)
}

// newTracker tracks the published GPUs' health, with the checkpoint in
// --state-dir, prev's marks when a layout was published before, and the
// health collectors kept current.
func (n *Node) newTracker(gpus GPUs, prev *health.Tracker) *health.Tracker {
	uuids := gpus.UUIDs()
	opts := []health.Option{health.WithLogger(n.log), health.WithIgnoredXids(n.cfg.IgnoredXids), health.WithQuietPeriod(n.cfg.QuietPeriod)}
	if n.cfg.StateDir != "" {
		opts = append(opts, health.WithCheckpoint(filepath.Join(n.cfg.StateDir, checkpointFile)))
	}
	if prev != nil {
		opts = append(opts, health.WithCarry(prev))
	}
	if n.events == nil {
		return health.New(uuids, opts...)
	}
	setHealthy := func(states []health.State) {
		for i, s := range states {
			v := 0.0
			if s.Healthy {
				v = 1
			}
			n.healthy.WithLabelValues(s.UUID, n.names.DeviceID(gpus.Published[i])).Set(v)
		}
	}
	opts = append(opts, health.WithOnChange(setHealthy), health.WithObserver(func(e gpu.HealthEvent, ignored bool) {
		xid := ""
		if e.Kind == gpu.EventXid {
			xid = strconv.FormatUint(e.Xid, 10)
		}
		n.events.WithLabelValues(e.Kind.String(), xid, strconv.FormatBool(ignored)).Inc()
	}))
	t := health.New(uuids, opts...)
	setHealthy(t.States())
	return t
}

// newReported reports t's health at most once per --health-update-interval,
// counting what it coalesces.
func (n *Node) newReported(t *health.Tracker) *health.Reported {
	var opts []coalesce.Option
	if n.coalesced != nil {
		opts = append(opts, coalesce.WithOnCoalesced(n.coalesced.Inc))
	}
	return health.NewReported(t, n.cfg.HealthUpdate, opts...)
}

// recoverOnSignal recovers every GPU on each signal, then asks for the
// MIG layout to be read again (rescan, which never blocks).
func (n *Node) recoverOnSignal(ctx context.Context, t *health.Tracker, rescan chan<- struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.recover:
			n.log.Info("operator recovery: asking NVML about every GPU before clearing its Xid and loss marks")
			if err := t.RecoverAll(ctx); err != nil && ctx.Err() == nil {
				n.log.Warn("operator recovery: NVML does not vouch for some GPUs; they stay Unhealthy", logging.Err(err))
			}
			select {
			case rescan <- struct{}{}:
			default:
			}
		}
	}
}
