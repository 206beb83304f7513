package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvinject/nvinject/dra/scalesim"
	"github.com/nvinject/nvinject/shared/contract"
)

// Paths: a node's GPUs go through the device plugin or DRA (its gpu-mode label).
const (
	PathDevicePlugin = contract.DRAModeDevicePlugin
	PathDRA          = contract.DRAModeDRA
	// PathCEL is DRA pods whose claim template selects GPUs by a CEL
	// expression over their memory, not the extended resource.
	PathCEL = "dra-cel"
)

// kwokLabel marks the simulator's nodes; KWOK manages exactly those.
const kwokLabel = "nvinject.io/scale-sim"

// gpuPresentLabel is what GPU feature discovery (and nvinject's DaemonSets) select GPU nodes by.
const gpuPresentLabel = "nvidia.com/gpu.present"

// simNode is one fake node: its path and, for its labels and DRA slices, nvinject-dra's
// view of its simulated GPUs.
type simNode struct {
	path string
	sim  *scalesim.Node
}

// nodeName names node i; even nodes are device-plugin nodes, odd ones DRA nodes.
func nodeName(i int) string { return fmt.Sprintf("gpu-%05d", i) }

func nodePath(i int) string {
	if i%2 == 0 {
		return PathDevicePlugin
	}
	return PathDRA
}

// buildNodes discovers every node's simulated GPUs.
func buildNodes(ctx context.Context, n int, nvml, stateDir string) ([]simNode, error) {
	nodes := make([]simNode, n)
	err := parallel(ctx, n, 8, func(i int) error {
		s, err := scalesim.NewNode(ctx, nodeName(i), nvml, filepath.Join(stateDir, nodePath(i)))
		nodes[i] = simNode{path: nodePath(i), sim: s}
		return err
	})
	return nodes, err
}

// nodeObject is the Node as kubelet and nvinject's plugins would leave it, less
// the status KWOK fills in.
func nodeObject(n simNode) *corev1.Node {
	l := n.sim.Labels()
	l[gpuPresentLabel] = "true"
	l[contract.DRAModeLabel] = n.path
	l[kwokLabel] = "kwok"
	l[corev1.LabelHostname] = n.sim.Name()
	l[corev1.LabelOSStable], l[corev1.LabelArchStable] = "linux", "amd64"
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.sim.Name(), Labels: l}}
}

// capacity is what kubelet reports; on a device-plugin node that includes the
// plugin's nvidia.com/gpu, on a DRA node it does not (DRA serves the name).
func capacity(n simNode) corev1.ResourceList {
	rl := corev1.ResourceList{}
	for k, v := range map[corev1.ResourceName]string{corev1.ResourceCPU: "64", corev1.ResourceMemory: "1Ti", corev1.ResourcePods: "110"} {
		rl[k] = mustQuantity(v)
	}
	if n.path == PathDevicePlugin {
		rl[contract.ResourceName] = mustQuantity(fmt.Sprint(n.sim.GPUs()))
	}
	return rl
}

// createNodes creates the Node objects and sets their capacity, as kubelet
// registers a node and reports its status.
func createNodes(ctx context.Context, client kubernetes.Interface, nodes []simNode) error {
	return parallel(ctx, len(nodes), 32, func(i int) error {
		n := nodes[i]
		if _, err := client.CoreV1().Nodes().Create(ctx, nodeObject(n), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", n.sim.Name(), err)
		}
		c := capacity(n)
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": c, "allocatable": c}})
		if err != nil {
			return err
		}
		if _, err := client.CoreV1().Nodes().Patch(ctx, n.sim.Name(), types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("report the capacity of node %s: %w", n.sim.Name(), err)
		}
		return nil
	})
}

// waitNodesReady waits until want nodes are Ready.
func waitNodesReady(ctx context.Context, client kubernetes.Interface, want int, timeout time.Duration) error {
	return poll(ctx, timeout, 2*time.Second, func() (bool, string, error) {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: kwokLabel})
		if err != nil {
			return false, "", err
		}
		ready := 0
		for _, n := range list.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready >= want, fmt.Sprintf("%d of %d nodes Ready", ready, want), nil
	})
}

// publication is the DRA nodes' ResourceSlice controllers and when each node's
// slice was first seen.
type publication struct {
	mu   sync.Mutex
	seen map[string]time.Time
	// byNode is each DRA node's controller.
	byNode   map[string]*resourceslice.Controller
	errs     []error
	start    time.Time
	informer cache.SharedIndexInformer
}

// publish starts one ResourceSlice controller per DRA node, as each node's
// nvinject-dra would, and watches the slices appear.
func publish(ctx context.Context, client kubernetes.Interface, nodes []simNode) (*publication, error) {
	p := &publication{seen: map[string]time.Time{}}
	f := informers.NewSharedInformerFactory(client, 0)
	p.informer = f.Resource().V1().ResourceSlices().Informer()
	if _, err := p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		if s, ok := obj.(*resourceapi.ResourceSlice); ok {
			p.mu.Lock()
			if _, dup := p.seen[s.Spec.Pool.Name]; !dup {
				p.seen[s.Spec.Pool.Name] = time.Now()
			}
			p.mu.Unlock()
		}
	}}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		return nil, fmt.Errorf("watch ResourceSlices: %w", ctx.Err())
	}
	if n := len(p.informer.GetStore().List()); n != 0 {
		return nil, fmt.Errorf("%d ResourceSlices exist before publishing: the control plane is not fresh", n)
	}
	var dra []simNode
	for _, n := range nodes {
		if n.path == PathDRA {
			dra = append(dra, n)
		}
	}
	p.start = time.Now()
	ctrls := make([]*resourceslice.Controller, len(dra))
	// StartController returns once its informer synced; many start at once.
	err := parallel(ctx, len(dra), 64, func(i int) error {
		c, err := dra[i].sim.Publish(ctx, client, func(node string, err error) {
			p.mu.Lock()
			p.errs = append(p.errs, fmt.Errorf("node %s: %w", node, err))
			p.mu.Unlock()
		})
		ctrls[i] = c
		return err
	})
	p.byNode = map[string]*resourceslice.Controller{}
	for i, c := range ctrls {
		if c != nil {
			p.byNode[dra[i].sim.Name()] = c
		}
	}
	return p, err
}

// wait returns once want nodes' slices were seen: how long from the start, and
// when half were.
func (p *publication) wait(ctx context.Context, want int, timeout time.Duration) (all, half time.Duration, err error) {
	err = poll(ctx, timeout, 100*time.Millisecond, func() (bool, string, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if len(p.errs) > 0 {
			return false, "", fmt.Errorf("publishing ResourceSlices failed: %w (and %d more)", p.errs[0], len(p.errs)-1)
		}
		return len(p.seen) >= want, fmt.Sprintf("slices of %d of %d nodes", len(p.seen), want), nil
	})
	if err != nil {
		return 0, 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var ts []time.Duration
	for _, t := range p.seen {
		ts = append(ts, t.Sub(p.start))
	}
	slices.Sort(ts)
	return ts[len(ts)-1], ts[len(ts)/2], nil
}

func (p *publication) stop() {
	for _, c := range p.byNode {
		c.Stop()
	}
}

// parallel runs f(0..n-1) on at most workers goroutines; the first error stops it.
func parallel(ctx context.Context, n, workers int, f func(i int) error) error {
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error { return f(i) })
	}
	return g.Wait()
}

// poll calls check every interval until it is done, fails, or timeout passes; the
// timeout error says where check last was.
func poll(ctx context.Context, timeout, interval time.Duration, check func() (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		done, where, err := check()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		last = where
		select {
		case <-ctx.Done():
			return fmt.Errorf("not done after %s: %s", timeout, last)
		case <-time.After(interval):
		}
	}
}
