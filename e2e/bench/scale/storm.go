package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/gpunode/health/coalesce"
	"github.com/nvinject/nvinject/shared/contract"
)

// The API writes a health change costs, by path: nvinject-dra republishes
// the node's ResourceSlice; on a device-plugin node kubelet writes the
// Node's allocatable on its next status sync.
var stormWrite = map[string]string{
	PathDRA:          requestKey("PUT", "resourceslices", ""),
	PathDevicePlugin: requestKey("PATCH", "nodes", "status"),
}

// stormReason is the flapping GPU's Xid, as the health tracker words it.
const stormReason = "Xid 48: double-bit ECC error"

// flapper is one node whose GPUs flap: its states go through the limiter
// nvinject's daemons report health through; on a DRA node each delivery is
// one write, on a device-plugin node kubelet writes on its status sync.
type flapper struct {
	node   simNode
	gpus   []int // indexes into the node's states
	states []health.State
	lim    *coalesce.Limiter[[]health.State]
	// offset is when in each second this node's GPUs flap: flaps on many
	// nodes are not in step.
	offset time.Duration
	// last is what the limiter delivered last (under storm's lock).
	last []health.State
	// kubelet writes a device-plugin node's allocatable; nil on DRA nodes.
	kubelet *kubeletStatus
}

// flap toggles f's GPUs every half second from its offset until end, an
// Xid and then its recovery, each change handed to the limiter; it returns
// the changes made.
func (f *flapper) flap(ctx context.Context, end time.Time) int {
	select {
	case <-ctx.Done():
		return 0
	case <-time.After(f.offset):
	}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for unhealthy := true; time.Now().Before(end); unhealthy = !unhealthy {
		for _, g := range f.gpus {
			f.states[g] = health.State{UUID: f.states[g].UUID, Healthy: !unhealthy}
			if unhealthy {
				f.states[g].Reason = stormReason
			}
		}
		f.lim.Update(slices.Clone(f.states))
		n++
		select {
		case <-ctx.Done():
			return n
		case <-tick.C:
		}
	}
	return n
}

// kubeletStatus stands for a device-plugin node's kubelet: it takes the
// plugin's ListAndWatch sends as they come and writes the node's
// allocatable on its own status sync, every period
// (nodeStatusUpdateFrequency), only when it changed, as kubelet's
// syncNodeStatus does.
type kubeletStatus struct {
	period, offset time.Duration
	write          func(ctx context.Context, healthy int) error
	mu             sync.Mutex
	latest         int
	written        int
}

func newKubeletStatus(gpus int, period, offset time.Duration, write func(context.Context, int) error) *kubeletStatus {
	return &kubeletStatus{period: period, offset: offset, write: write, latest: gpus, written: gpus}
}

// set is one ListAndWatch send: the healthy GPUs the plugin lists.
func (k *kubeletStatus) set(states []health.State) {
	healthy := 0
	for _, s := range states {
		if s.Healthy {
			healthy++
		}
	}
	k.mu.Lock()
	k.latest = healthy
	k.mu.Unlock()
}

// synced reports whether the node's allocatable is the plugin's last list.
func (k *kubeletStatus) synced() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.latest == k.written
}

// run syncs every period from offset on until ctx ends; writes use wctx,
// so one in flight when ctx ends completes.
func (k *kubeletStatus) run(ctx, wctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(k.offset):
	}
	tick := time.NewTicker(k.period)
	defer tick.Stop()
	for {
		k.mu.Lock()
		latest, changed := k.latest, k.latest != k.written
		k.mu.Unlock()
		if changed {
			if err := k.write(wctx, latest); err != nil {
				return err
			}
			k.mu.Lock()
			k.written = latest
			k.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// stormNodes spreads gpus flapping GPUs over the nodes, both paths taking
// turns, one GPU a node before a second on any.
func stormNodes(nodes []simNode, gpus int) map[int][]int {
	out := map[int][]int{}
	var byPath [2][]int
	for i, n := range nodes {
		if n.path == PathDevicePlugin {
			byPath[0] = append(byPath[0], i)
		} else {
			byPath[1] = append(byPath[1], i)
		}
	}
	for j := range gpus {
		p := byPath[j%2]
		if len(p) == 0 {
			p = byPath[1-j%2]
		}
		k := j / 2
		node := p[k%len(p)]
		out[node] = append(out[node], (k/len(p))%nodes[node].sim.GPUs())
	}
	return out
}

// stormBound is the most writes a limiter at interval lets through for
// nodes flapping for d: deliveries start at least interval apart, the
// first at once, and the final one within interval after the last flap.
func stormBound(nodes int, d, interval time.Duration) int {
	if interval <= 0 {
		return math.MaxInt
	}
	return nodes * (int(math.Ceil(float64(d)/float64(interval))) + 1)
}

// syncBound is the most writes kubelets syncing every period make for
// nodes whose plugins send for d through a limiter at interval: one a sync,
// the last sync within a period after the final send.
func syncBound(nodes int, d, interval, period time.Duration) int {
	return nodes * (int((d+interval+period)/period) + 1)
}

// ratio is storm over quiet, 0 where quiet is 0.
func ratio(storm, quiet Duration) float64 {
	if quiet <= 0 {
		return 0
	}
	return float64(storm) / float64(quiet)
}

// spread is the i-th of n offsets evenly over period.
func spread(i, n int, period time.Duration) time.Duration {
	if n == 0 {
		return 0
	}
	return time.Duration(i) * period / time.Duration(n)
}

// storm flaps the chosen GPUs at 1 Hz (an Xid, half a second later its
// recovery; each node at its own point in the second) for d, every change
// through a limiter at interval. The DRA node's deliveries republish its
// ResourceSlice through its controller; the device-plugin node's go to
// its kubelet, which writes allocatable on its status sync every
// kubeletSync. It returns once every node's final state was written.
func storm(parent context.Context, client kubernetes.Interface, nodes []simNode, chosen map[int][]int, ctrls map[string]*resourceslice.Controller, d, interval, kubeletSync time.Duration, st *Storm) error {
	// Writes use parent: one in flight when the limiters stop completes.
	ctx, cancel := context.WithCancel(parent)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	defer func() { cancel(); wg.Wait() }()
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	st.Delivered = map[string]int{}
	idx := slices.Sorted(maps.Keys(chosen))
	var flappers []*flapper
	for j, i := range idx {
		n := nodes[i]
		f := &flapper{node: n, gpus: chosen[i], states: n.sim.Reported(), offset: spread(j, len(idx), time.Second)}
		f.last = slices.Clone(f.states)
		st.FlappingNodes.add(n.path, 1)
		st.FlappingGPUs.add(n.path, len(f.gpus))
		if n.path == PathDevicePlugin {
			f.kubelet = newKubeletStatus(len(f.states), kubeletSync, spread(j, len(idx), kubeletSync),
				func(ctx context.Context, healthy int) error {
					return writeAllocatable(ctx, client, n.sim.Name(), healthy)
				})
			wg.Go(func() {
				if err := f.kubelet.run(ctx, parent); err != nil {
					fail(err)
				}
			})
		}
		deliver := func(states []health.State) {
			if f.kubelet != nil {
				f.kubelet.set(states)
			} else {
				res := n.sim.SetReported(states)
				ctrls[n.sim.Name()].Update(&res)
			}
			mu.Lock()
			st.Delivered[n.path]++
			f.last = states
			mu.Unlock()
		}
		// The limiter keeps what it holds: states is the flapper's to change.
		f.lim = coalesce.New(interval, slices.Clone(f.states), slices.Equal[[]health.State], deliver)
		flappers = append(flappers, f)
		wg.Go(func() { f.lim.Run(ctx) })
	}
	end := time.Now().Add(d)
	var flaps sync.WaitGroup
	for _, f := range flappers {
		flaps.Go(func() {
			n := f.flap(ctx, end)
			mu.Lock()
			st.Changes += n
			mu.Unlock()
		})
	}
	flaps.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	// The last change was a recovery unless a node's storm ended on an Xid.
	for _, f := range flappers {
		for _, g := range f.gpus {
			f.states[g] = health.State{UUID: f.states[g].UUID, Healthy: true}
		}
		f.lim.Update(slices.Clone(f.states))
	}
	// The final state goes out within interval and, on device-plugin nodes,
	// is written at kubelet's next sync; then the limiters stop.
	err := poll(parent, interval+kubeletSync+time.Minute, 100*time.Millisecond, func() (bool, string, error) {
		mu.Lock()
		defer mu.Unlock()
		left := 0
		for _, f := range flappers {
			if !slices.Equal(f.last, f.states) || (f.kubelet != nil && !f.kubelet.synced()) {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d nodes' final health not written", left), nil
	})
	cancel()
	wg.Wait()
	if err != nil {
		return err
	}
	if len(errs) > 0 {
		return fmt.Errorf("report health: %w (and %d more)", errs[0], len(errs)-1)
	}
	return nil
}

// writeAllocatable is kubelet's node status write of a device-plugin
// node's allocatable nvidia.com/gpu, its healthy GPUs.
func writeAllocatable(ctx context.Context, client kubernetes.Interface, node string, healthy int) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"allocatable": corev1.ResourceList{contract.ResourceName: mustQuantity(fmt.Sprint(healthy))}}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("report the allocatable GPUs of node %s: %w", node, err)
	}
	return nil
}

// wrong counts GPUs not in their true state after the storm (every GPU
// Healthy): devices still tainted in a ResourceSlice, and device-plugin
// nodes' allocatable short of their GPUs.
func wrong(ctx context.Context, client kubernetes.Interface, nodes []simNode) (int, error) {
	n := 0
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("list ResourceSlices: %w", err)
	}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			for _, t := range d.Taints {
				if t.Key == contract.DRATaintKey {
					n++
				}
			}
		}
	}
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: contract.DRAModeLabel + "=" + PathDevicePlugin})
	if err != nil {
		return 0, fmt.Errorf("list nodes: %w", err)
	}
	gpus := map[string]int{}
	for _, sn := range nodes {
		gpus[sn.sim.Name()] = sn.sim.GPUs()
	}
	for _, node := range list.Items {
		a := node.Status.Allocatable[contract.ResourceName]
		n += max(0, gpus[node.Name]-int(a.Value()))
	}
	return n, nil
}

// settle waits until no GPU is in a wrong state, or timeout: the wrong ones
// left and how long it took.
func settle(ctx context.Context, client kubernetes.Interface, nodes []simNode, timeout time.Duration) (int, time.Duration, error) {
	start := time.Now()
	left := 0
	err := poll(ctx, timeout, 250*time.Millisecond, func() (bool, string, error) {
		n, err := wrong(ctx, client, nodes)
		left = n
		return n == 0, fmt.Sprintf("%d GPUs in a wrong state", n), err
	})
	if left > 0 {
		return left, time.Since(start), nil
	}
	return 0, time.Since(start), err
}

// PerPath counts something per path.
type PerPath map[string]int

func (p *PerPath) add(path string, n int) {
	if *p == nil {
		*p = PerPath{}
	}
	(*p)[path] += n
}

// Storm is what the health storm measured.
type Storm struct {
	// Duration the GPUs flapped, Interval the limiter's (--health-update-interval),
	// KubeletSync the device-plugin nodes' kubelet status sync.
	Duration      Duration `json:"duration"`
	Interval      Duration `json:"interval"`
	KubeletSync   Duration `json:"kubeletSync"`
	FlappingNodes PerPath  `json:"flappingNodes"`
	FlappingGPUs  PerPath  `json:"flappingGPUs"`
	// Changes is the health changes handed to the limiters, Delivered what
	// they let through: slice updates on DRA nodes, ListAndWatch sends to
	// kubelet on device-plugin nodes.
	Changes   int          `json:"changes"`
	Delivered PerPath      `json:"delivered"`
	Writes    []StormWrite `json:"writes"`
	// Latency is the probe pods' scheduling, storm against the quiet phase.
	Latency []LatencyRatio `json:"latency"`
	// Wrong is the GPUs not in their true state (all Healthy) once Settled
	// passed after the storm; it must be 0.
	Wrong   int      `json:"wrong"`
	Settled Duration `json:"settled"`
}

// StormWrite is one path's health writes: the API server's count in the
// storm phase, less the quiet phase's (scaled to the same length; others
// make them too, KWOK for one), against the bound: the limiter's on DRA
// nodes, kubelet's status sync on device-plugin nodes.
type StormWrite struct {
	Path      string  `json:"path"`
	Request   string  `json:"request"`
	Storm     float64 `json:"storm"`
	Quiet     float64 `json:"quiet"`
	Excess    float64 `json:"excess"`
	PerSecond float64 `json:"perSecond"`
	Bound     int     `json:"bound"`
	Within    bool    `json:"within"`
}

// LatencyRatio is one path's probe scheduling latency, storm over quiet.
type LatencyRatio struct {
	Path     string  `json:"path"`
	Quiet    Latency `json:"quiet"`
	Storm    Latency `json:"storm"`
	P50Ratio float64 `json:"p50Ratio"`
	P99Ratio float64 `json:"p99Ratio"`
}

// stormWrites compares each path's writes in the storm phase with the quiet one's.
func stormWrites(st *Storm, quiet, storm Phase) []StormWrite {
	scale := 1.0
	if quiet.Duration > 0 {
		scale = float64(storm.Duration) / float64(quiet.Duration)
	}
	var out []StormWrite
	for _, path := range []string{PathDevicePlugin, PathDRA} {
		key := stormWrite[path]
		d, interval := time.Duration(st.Duration), time.Duration(st.Interval)
		bound := stormBound(st.FlappingNodes[path], d, interval)
		if path == PathDevicePlugin {
			bound = syncBound(st.FlappingNodes[path], d, interval, time.Duration(st.KubeletSync))
		}
		w := StormWrite{Path: path, Request: key, Storm: storm.Requests[key], Quiet: quiet.Requests[key] * scale, Bound: bound}
		w.Excess = max(0, w.Storm-w.Quiet)
		w.PerSecond = w.Excess / time.Duration(st.Duration).Seconds()
		w.Within = w.Excess <= float64(w.Bound)
		out = append(out, w)
	}
	return out
}

// latencyRatios pairs the quiet and storm phases' probe latencies by path.
func latencyRatios(quiet, storm Phase) []LatencyRatio {
	var out []LatencyRatio
	for _, s := range storm.Paths {
		for _, q := range quiet.Paths {
			if q.Name == s.Name {
				out = append(out, LatencyRatio{Path: s.Name, Quiet: q.Scheduled, Storm: s.Scheduled,
					P50Ratio: ratio(s.Scheduled.P50, q.Scheduled.P50), P99Ratio: ratio(s.Scheduled.P99, q.Scheduled.P99)})
			}
		}
	}
	return out
}
