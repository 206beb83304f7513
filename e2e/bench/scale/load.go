package scale

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nvinject/nvinject/shared/contract"
)

// Namespace holds the simulator's pods.
const Namespace = "nvinject-scale"

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }

// podTimes is one pod's life as the simulator's watch saw it.
type podTimes struct {
	path                    string
	phase                   string
	created, bound, running time.Time
	// deleted pods stay in their phase's figures but are no longer picked.
	deleted bool
}

// tracker records when each pod was created, bound and Running.
type tracker struct {
	mu   sync.Mutex
	pods map[string]*podTimes
}

func newTracker(ctx context.Context, client kubernetes.Interface) (*tracker, error) {
	t := &tracker{pods: map[string]*podTimes{}}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(Namespace))
	inf := f.Core().V1().Pods().Informer()
	see := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := time.Now()
		t.mu.Lock()
		defer t.mu.Unlock()
		p := t.pods[pod.Name]
		if p == nil {
			return
		}
		if pod.Spec.NodeName != "" && p.bound.IsZero() {
			p.bound = now
		}
		if pod.Status.Phase == corev1.PodRunning && p.running.IsZero() {
			p.running = now
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, obj any) { see(obj) }}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("watch pods: %w", ctx.Err())
	}
	return t, nil
}

// podObject is a pod asking for one nvidia.com/gpu, steered to a path's nodes.
func podObject(name, path string) *corev1.Pod {
	gpu := corev1.ResourceList{contract.ResourceName: mustQuantity("1")}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: map[string]string{"app": "nvinject-scale", "path": path}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{contract.DRAModeLabel: path},
			Containers: []corev1.Container{{Name: "gpu", Image: "registry.k8s.io/pause:3.10.1",
				Resources: corev1.ResourceRequirements{Limits: gpu, Requests: gpu}}},
		},
	}
}

// create creates one pod of path, recording its creation time first.
func (t *tracker) create(ctx context.Context, client kubernetes.Interface, name, path, phase string) error {
	return t.createPod(ctx, client, podObject(name, path), path, phase)
}

// createPod creates pod, counted under path and phase.
func (t *tracker) createPod(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, path, phase string) error {
	t.mu.Lock()
	t.pods[pod.Name] = &podTimes{path: path, phase: phase, created: time.Now()}
	t.mu.Unlock()
	if _, err := client.CoreV1().Pods(Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", pod.Name, err)
	}
	return nil
}

// runningOf picks every Running pod of phase not yet picked, to delete.
func (t *tracker) runningOf(phase string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var names []string
	for name, p := range t.pods {
		if p.phase == phase && !p.running.IsZero() && !p.deleted {
			p.deleted = true
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// reap deletes every Running pod of phase not yet deleted.
func (t *tracker) reap(ctx context.Context, client kubernetes.Interface, phase string) error {
	for _, name := range t.runningOf(phase) {
		if err := client.CoreV1().Pods(Namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete pod %s: %w", name, err)
		}
	}
	return nil
}

// running counts phase's pods that are Running, and of all of them.
func (t *tracker) running(phase string) (running, all int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.pods {
		if p.phase != phase {
			continue
		}
		all++
		if !p.running.IsZero() {
			running++
		}
	}
	return running, all
}

// waitRunning waits until every pod of phase runs.
func (t *tracker) waitRunning(ctx context.Context, phase string, timeout time.Duration) error {
	return poll(ctx, timeout, 250*time.Millisecond, func() (bool, string, error) {
		r, all := t.running(phase)
		return r == all, fmt.Sprintf("%d of %d %s pods Running", r, all, phase), nil
	})
}

// pick chooses a Running pod of path to delete (rng is used under the lock).
func (t *tracker) pick(path string, rng *rand.Rand) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var names []string
	for name, p := range t.pods {
		if p.path == path && !p.running.IsZero() && !p.deleted {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return ""
	}
	slices.Sort(names)
	name := names[rng.IntN(len(names))]
	t.pods[name].deleted = true
	return name
}

// paths is phase's latencies per path that had pods in it.
func (t *tracker) paths(phase string) []Path {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Path
	for _, path := range []string{PathDevicePlugin, PathDRA, PathCEL} {
		var bound, running []time.Duration
		n := 0
		for _, p := range t.pods {
			if p.phase != phase || p.path != path {
				continue
			}
			n++
			if !p.bound.IsZero() {
				bound = append(bound, p.bound.Sub(p.created))
			}
			if !p.running.IsZero() {
				running = append(running, p.running.Sub(p.created))
			}
		}
		if n == 0 {
			continue
		}
		out = append(out, Path{Name: path, Pods: n, Scheduled: latency(bound), Running: latency(running)})
	}
	return out
}

// fill creates perPath[path] pods of each path, interleaved, from workers at once,
// and waits until they run.
func fill(ctx context.Context, client kubernetes.Interface, t *tracker, perPath map[string]int, workers int, timeout time.Duration) error {
	type job struct{ name, path string }
	var jobs []job
	for i := 0; ; i++ {
		added := false
		for _, path := range []string{PathDevicePlugin, PathDRA} {
			if i < perPath[path] {
				jobs = append(jobs, job{fmt.Sprintf("%s-fill-%06d", path, i), path})
				added = true
			}
		}
		if !added {
			break
		}
	}
	if err := parallel(ctx, len(jobs), workers, func(i int) error {
		return t.create(ctx, client, jobs[i].name, jobs[i].path, phaseFill)
	}); err != nil {
		return err
	}
	return t.waitRunning(ctx, phaseFill, timeout)
}

// churn replaces one Running pod a tick (rate a second, alternating paths) for d:
// it deletes one and creates another of the same path, then waits until the new
// ones run.
func churn(ctx context.Context, client kubernetes.Interface, t *tracker, rate float64, d, timeout time.Duration) error {
	rng := rand.New(rand.NewPCG(1, 2))
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	end := time.Now().Add(d)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for i := 0; time.Now().Before(end); i++ {
		path := []string{PathDevicePlugin, PathDRA}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := t.create(ctx, client, fmt.Sprintf("%s-churn-%06d", path, i), path, phaseChurn)
			if err == nil {
				if victim := t.pick(path, rng); victim != "" {
					err = client.CoreV1().Pods(Namespace).Delete(ctx, victim, metav1.DeleteOptions{})
				}
			}
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		}()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errs:
			return err
		case <-tick.C:
		}
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	return t.waitRunning(ctx, phaseChurn, timeout)
}
