// Package scale is the fleet-scale simulator: thousands of fake GPU nodes (KWOK),
// half on the device plugin's path and half on DRA's, against a real control plane
// (etcd, kube-apiserver, kube-scheduler, kube-controller-manager from e2e/harness/kubelocal,
// on ports and a run dir of its own). The DRA nodes' ResourceSlices are nvinject-dra's
// own (dra/scalesim); pods ask for nvidia.com/gpu: 1, which on DRA nodes the
// DeviceClass's extendedResourceName serves. Run measures slice publication, the
// fill to 90 % of the GPUs, a steady churn, pods of a CEL claim template, a
// health storm (a share of the GPUs flapping through the daemons' limiter) against
// a quiet phase, the API traffic, etcd and memory.
package scale

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"sigs.k8s.io/yaml"

	"github.com/nvinject/nvinject/deploy"
	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/e2e/harness/kwok"
	"github.com/nvinject/nvinject/gpunode/nodeconfig"
)

// Ports are the simulator's control-plane ports, apart from kubelocal.DefaultPorts so
// it runs beside a local node.
var Ports = kubelocal.Ports{
	EtcdClient: 24790, EtcdPeer: 24800, APIServer: 17443,
	ControllerManager: 11357, Scheduler: 11359, Kubelet: 11350, KubeletHealthz: 11348,
}

// DefaultRunDir holds the simulator's control plane.
const DefaultRunDir = "/tmp/nvinject-scale"

// Config is one run.
type Config struct {
	Nodes    int
	RunDir   string
	Ports    kubelocal.Ports
	ToolsBin string
	KwokBin  string
	// NVML is every node's simulated GPUs (sim:h100-80gb*8).
	NVML string
	// Fill is the fraction of the GPUs the fill asks for (0.9).
	Fill float64
	// ChurnRate pods a second are replaced for ChurnFor.
	ChurnRate float64
	ChurnFor  time.Duration
	// CELPods are created through the CEL claim template after the churn
	// (0: max(10, Nodes/10)).
	CELPods int
	// Storm is how long StormFraction of the GPUs flap after a quiet phase of
	// the same length (0: no storm); HealthInterval is the daemons'
	// --health-update-interval; KubeletSync the device-plugin nodes'
	// kubelet nodeStatusUpdateFrequency (10s).
	Storm          time.Duration
	StormFraction  float64
	HealthInterval time.Duration
	KubeletSync    time.Duration
	// ProbeRate pods a second a path are created in the quiet and storm
	// phases to time unrelated pods' scheduling.
	ProbeRate float64
	// Workers create the fill's pods at once.
	Workers int
	// WaitFor bounds each wait (nodes Ready, slices, pods Running).
	WaitFor time.Duration
	Log     *slog.Logger
}

// Defaults fills in what c leaves zero.
func (c Config) Defaults() Config {
	if c.Nodes == 0 {
		c.Nodes = 1000
	}
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir
	}
	if c.Ports == (kubelocal.Ports{}) {
		c.Ports = Ports
	}
	if c.NVML == "" {
		c.NVML = "sim:h100-80gb*8"
	}
	if c.Fill == 0 {
		c.Fill = 0.9
	}
	if c.ChurnRate == 0 {
		c.ChurnRate = 5
	}
	if c.ChurnFor == 0 {
		c.ChurnFor = time.Minute
	}
	if c.CELPods == 0 {
		c.CELPods = max(10, c.Nodes/10)
	}
	if c.StormFraction == 0 {
		c.StormFraction = 0.01
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = nodeconfig.DefaultHealthUpdate
	}
	if c.KubeletSync == 0 {
		c.KubeletSync = DefaultKubeletSync
	}
	if c.ProbeRate == 0 {
		c.ProbeRate = DefaultProbeRate
	}
	if c.Workers == 0 {
		c.Workers = 32
	}
	if c.WaitFor == 0 {
		c.WaitFor = 10 * time.Minute
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c
}

// DefaultKubeletSync is kubelet's default nodeStatusUpdateFrequency;
// DefaultProbeRate gives 180 probe pods a path a minute, enough for a p99.
const (
	DefaultKubeletSync = 10 * time.Second
	DefaultProbeRate   = 3.0
)

const (
	phaseNodes   = "nodes"
	phaseSlices  = "slices"
	phaseFill    = "fill"
	phaseChurn   = "churn"
	phaseCEL     = "cel"
	phaseQuiet   = "quiet"
	phaseStorm   = "storm"
	deviceClassF = "components/dra/deviceclass.yaml"
)

// controlPlaneArgs size the control plane for thousands of nodes: the API
// server's request limits (APF shares them out) and the controllers' client QPS,
// which by default (scheduler 50, controller-manager 20) throttle binding and
// the DRA claims the scheduler and the claim controller write.
var controlPlaneArgs = map[string][]string{
	"kube-apiserver":          {"--max-requests-inflight=800", "--max-mutating-requests-inflight=400"},
	"kube-scheduler":          {"--kube-api-qps=300", "--kube-api-burst=600"},
	"kube-controller-manager": {"--kube-api-qps=200", "--kube-api-burst=400"},
}

// Run brings the control plane and KWOK up, runs the phases, measures, and tears
// everything down again (the run dir's logs stay).
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	cfg = cfg.Defaults()
	start := time.Now()
	log := cfg.Log
	rep.Nodes = cfg.Nodes
	opts := []kubelocal.Option{kubelocal.WithControlPlaneOnly(), kubelocal.WithRunDir(cfg.RunDir),
		kubelocal.WithPorts(cfg.Ports), kubelocal.WithToolsBin(cfg.ToolsBin), kubelocal.WithLogger(log),
		kubelocal.WithTimeout(2 * time.Minute)}
	for c, args := range controlPlaneArgs {
		opts = append(opts, kubelocal.WithComponentArgs(c, args...))
	}
	node := kubelocal.New(opts...)
	if err := node.Up(ctx); err != nil {
		_ = node.Down(context.Background())
		return rep, fmt.Errorf("bring the control plane up: %w", err)
	}
	defer func() {
		if derr := node.Down(context.Background()); derr != nil {
			err = errors.Join(err, fmt.Errorf("tear the control plane down: %w", derr))
		}
	}()
	// Cancelled before the teardown, so no watch of Run's outlives the API server.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rep.ControlPlaneUp = Duration(time.Since(start))

	restCfg, err := clientcmd.BuildConfigFromFlags("", node.Kubeconfig())
	if err != nil {
		return rep, fmt.Errorf("read the admin kubeconfig: %w", err)
	}
	// Thousands of kubelets and plugins are each rate-limited on their own; the
	// simulator speaks for all of them, so only the API server limits it.
	restCfg.RateLimiter = flowcontrol.NewFakeAlwaysRateLimiter()
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return rep, err
	}
	scr, err := newScrapers(restCfg, client.CoreV1().RESTClient(), node.SchedulerURL(), node.EtcdURL())
	if err != nil {
		return rep, err
	}
	if err := setup(ctx, client); err != nil {
		return rep, err
	}
	k, err := kwok.Start(kwok.Config{Bin: cfg.KwokBin, Kubeconfig: node.Kubeconfig(), Dir: filepath.Join(cfg.RunDir, "logs", "kwok"),
		// A lease a node every 10s, as kubelet renews it: at ~0.5s a renewal on a
		// busy API server, nodes/20 renewals in flight keep up. Nodes register at
		// once, as kubelets do; 16 at a time took 7 minutes for 5,000, and nodes KWOK
		// had not reached by the node controller's startup grace went Unknown.
		NodeSelector: kwokLabel, Parallelism: max(16, cfg.Nodes/50), LeaseParallelism: max(16, cfg.Nodes/20)})
	if err != nil {
		return rep, err
	}
	defer func() {
		if serr := k.Stop(context.Background()); serr != nil {
			err = errors.Join(err, fmt.Errorf("stop kwok: %w", serr))
		}
	}()
	m := &meter{scr: scr}
	if err := m.start(ctx); err != nil {
		return rep, err
	}

	log.Info("creating nodes", "nodes", cfg.Nodes, "gpus", cfg.NVML)
	nodes, err := buildNodes(ctx, cfg.Nodes, cfg.NVML, filepath.Join(cfg.RunDir, "dra-state"))
	if err != nil {
		return rep, err
	}
	perPath := map[string]int{}
	for _, n := range nodes {
		rep.GPUs += n.sim.GPUs()
		perPath[n.path] += n.sim.GPUs()
		if n.path == PathDRA {
			rep.DRANodes++
		}
	}
	for p, gpus := range perPath {
		perPath[p] = int(cfg.Fill * float64(gpus))
	}
	t0 := time.Now()
	if err := createNodes(ctx, client, nodes); err != nil {
		return rep, err
	}
	if err := waitNodesReady(ctx, client, cfg.Nodes, cfg.WaitFor); err != nil {
		return rep, fmt.Errorf("nodes: %w; see %s", err, k.LogFile())
	}
	rep.NodesReady = Duration(time.Since(t0))
	if err := m.phase(ctx, &rep, phaseNodes, nil); err != nil {
		return rep, err
	}

	log.Info("publishing ResourceSlices", "nodes", rep.DRANodes)
	pub, err := publish(ctx, client, nodes)
	if pub != nil {
		defer pub.stop()
	}
	if err != nil {
		return rep, err
	}
	all, half, err := pub.wait(ctx, rep.DRANodes, cfg.WaitFor)
	if err != nil {
		return rep, err
	}
	rep.SlicePublish, rep.SliceP50 = Duration(all), Duration(half)
	if err := m.phase(ctx, &rep, phaseSlices, nil); err != nil {
		return rep, err
	}

	t, err := newTracker(ctx, client)
	if err != nil {
		return rep, err
	}
	log.Info("filling", "pods", perPath, "fraction", cfg.Fill)
	if err := fill(ctx, client, t, perPath, cfg.Workers, cfg.WaitFor); err != nil {
		return rep, fmt.Errorf("fill: %w; see %s and %s", err, node.LogFile("kube-scheduler"), k.LogFile())
	}
	if err := m.phase(ctx, &rep, phaseFill, func(ph *Phase) error { return paths(ctx, client, t, ph) }); err != nil {
		return rep, err
	}

	log.Info("churning", "rate", cfg.ChurnRate, "for", cfg.ChurnFor)
	if err := churn(ctx, client, t, cfg.ChurnRate, cfg.ChurnFor, cfg.WaitFor); err != nil {
		return rep, fmt.Errorf("churn: %w; see %s", err, node.LogFile("kube-scheduler"))
	}
	if err := m.phase(ctx, &rep, phaseChurn, func(ph *Phase) error { return paths(ctx, client, t, ph) }); err != nil {
		return rep, err
	}

	log.Info("CEL claim-template pods", "pods", cfg.CELPods, "selector", celSelector)
	if err := cel(ctx, client, t, cfg.CELPods, cfg.ChurnRate, cfg.WaitFor); err != nil {
		return rep, fmt.Errorf("cel: %w; see %s", err, node.LogFile("kube-scheduler"))
	}
	if err := m.phase(ctx, &rep, phaseCEL, func(ph *Phase) error { return paths(ctx, client, t, ph) }); err != nil {
		return rep, err
	}
	if err := t.reap(ctx, client, phaseCEL); err != nil {
		return rep, err
	}

	if cfg.Storm > 0 {
		if err := runStorm(ctx, cfg, client, t, m, &rep, nodes, pub.byNode); err != nil {
			return rep, fmt.Errorf("storm: %w; see %s", err, node.LogFile("kube-scheduler"))
		}
	}

	if err := final(ctx, scr, node, k, &rep); err != nil {
		return rep, err
	}
	rep.Took = Duration(time.Since(start))
	return rep, nil
}

// runStorm runs the quiet phase, then the storm, each with probe pods kept
// off the flapping nodes, and fills rep.Storm.
func runStorm(ctx context.Context, cfg Config, client kubernetes.Interface, t *tracker, m *meter, rep *Report, nodes []simNode, ctrls map[string]*resourceslice.Controller) error {
	chosen := stormNodes(nodes, max(2, int(math.Round(cfg.StormFraction*float64(rep.GPUs)))))
	var avoided []string
	for i := range chosen {
		avoided = append(avoided, nodes[i].sim.Name())
	}
	slices.Sort(avoided)
	st := &Storm{Duration: Duration(cfg.Storm), Interval: Duration(cfg.HealthInterval), KubeletSync: Duration(cfg.KubeletSync)}
	withPaths := func(ph *Phase) error { return paths(ctx, client, t, ph) }

	cfg.Log.Info("quiet phase: probe pods", "for", cfg.Storm)
	if err := probe(ctx, client, t, phaseQuiet, cfg.Storm, cfg.ProbeRate, avoided, cfg.WaitFor); err != nil {
		return err
	}
	if err := m.phase(ctx, rep, phaseQuiet, withPaths); err != nil {
		return err
	}

	cfg.Log.Info("health storm", "nodes", len(chosen), "for", cfg.Storm, "interval", cfg.HealthInterval)
	probed := make(chan error, 1)
	go func() { probed <- probe(ctx, client, t, phaseStorm, cfg.Storm, cfg.ProbeRate, avoided, cfg.WaitFor) }()
	serr := storm(ctx, client, nodes, chosen, ctrls, cfg.Storm, cfg.HealthInterval, cfg.KubeletSync, st)
	if perr := <-probed; serr == nil {
		serr = perr
	}
	if serr != nil {
		return serr
	}
	wrongs, took, err := settle(ctx, client, nodes, 30*time.Second)
	if err != nil {
		return err
	}
	st.Wrong, st.Settled = wrongs, Duration(took)
	if err := m.phase(ctx, rep, phaseStorm, withPaths); err != nil {
		return err
	}
	quiet, stormPh := rep.Phases[len(rep.Phases)-2], rep.Phases[len(rep.Phases)-1]
	st.Writes = stormWrites(st, quiet, stormPh)
	st.Latency = latencyRatios(quiet, stormPh)
	rep.Storm = st
	return nil
}

// setup creates the pods' namespace and nvinject's DeviceClass, as deploy/ ships it.
func setup(ctx context.Context, client kubernetes.Interface) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", Namespace, err)
	}
	data, err := deploy.Files.ReadFile(deviceClassF)
	if err != nil {
		return fmt.Errorf("read deploy/%s: %w", deviceClassF, err)
	}
	var dc resourceapi.DeviceClass
	if err := yaml.UnmarshalStrict(data, &dc); err != nil {
		return fmt.Errorf("decode deploy/%s: %w", deviceClassF, err)
	}
	if _, err := client.ResourceV1().DeviceClasses().Create(ctx, &dc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create DeviceClass %s: %w", dc.Name, err)
	}
	return nil
}

// paths fills a phase's per-path figures: latencies, and the ResourceClaims
// allocated to the path's pods (the scheduler's, for pods on DRA nodes).
func paths(ctx context.Context, client kubernetes.Interface, t *tracker, ph *Phase) error {
	ph.Paths = t.paths(ph.Name)
	claims, err := client.ResourceV1().ResourceClaims(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ResourceClaims: %w", err)
	}
	byPath := map[string]int{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, o := range c.OwnerReferences {
			if o.Kind == "Pod" {
				t.mu.Lock()
				if p := t.pods[o.Name]; p != nil && p.phase == ph.Name {
					byPath[p.path]++
				}
				t.mu.Unlock()
			}
		}
	}
	for i := range ph.Paths {
		ph.Paths[i].Claims = byPath[ph.Paths[i].Name]
	}
	return nil
}

// meter takes the API server's and the scheduler's counters at each phase's end.
type meter struct {
	scr      *scrapers
	at       time.Time
	requests Requests
	attempts attempts
}

func (m *meter) read(ctx context.Context) (Requests, attempts, error) {
	api, err := m.scr.apiServer(ctx)
	if err != nil {
		return nil, attempts{}, err
	}
	sched, err := m.scr.schedulerMetrics(ctx)
	if err != nil {
		return nil, attempts{}, err
	}
	const name = "scheduler_schedule_attempts_total"
	return apiRequests(api), attempts{
		scheduled:     counter(sched, name, map[string]string{"result": "scheduled"}),
		unschedulable: counter(sched, name, map[string]string{"result": "unschedulable"}),
	}, nil
}

// attempts are the scheduler's attempts so far by result.
type attempts struct{ scheduled, unschedulable float64 }

func (m *meter) start(ctx context.Context) error {
	r, s, err := m.read(ctx)
	m.at, m.requests, m.attempts = time.Now(), r, s
	return err
}

// phase ends a phase: its requests and bindings since the last, then more.
func (m *meter) phase(ctx context.Context, rep *Report, name string, more func(*Phase) error) error {
	r, s, err := m.read(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	ph := Phase{Name: name, Duration: Duration(now.Sub(m.at)), Requests: r.Sub(m.requests),
		Scheduled: int64(s.scheduled - m.attempts.scheduled), Unschedulable: int64(s.unschedulable - m.attempts.unschedulable)}
	ph.RequestsTotal = ph.Requests.Total()
	ph.Throughput = float64(ph.Scheduled) / now.Sub(m.at).Seconds()
	m.at, m.requests, m.attempts = now, r, s
	if more != nil {
		if err := more(&ph); err != nil {
			return err
		}
	}
	rep.Phases = append(rep.Phases, ph)
	return nil
}

// final reads etcd's database size and every program's memory.
func final(ctx context.Context, scr *scrapers, node *kubelocal.Node, k *kwok.Controller, rep *Report) error {
	etcd, err := scr.etcdMetrics(ctx)
	if err != nil {
		return err
	}
	rep.EtcdDBBytes = int64(counter(etcd, "etcd_mvcc_db_total_size_in_bytes", nil))
	rep.EtcdDBInUseBytes = int64(counter(etcd, "etcd_mvcc_db_total_size_in_use_in_bytes", nil))
	procs := []struct {
		name string
		pid  int
	}{{"scale-sim (nodes, slices, load)", os.Getpid()}, {"kwok", k.PID()}}
	for _, c := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		pid, err := node.PID(c)
		if err != nil {
			return err
		}
		procs = append(procs, struct {
			name string
			pid  int
		}{c, pid})
	}
	for _, p := range procs {
		rss, peak, err := memory(p.pid)
		if err != nil {
			return fmt.Errorf("read the memory of %s (pid %d): %w", p.name, p.pid, err)
		}
		rep.Memory = append(rep.Memory, Process{Name: p.name, RSSBytes: rss, PeakBytes: peak})
	}
	return nil
}
