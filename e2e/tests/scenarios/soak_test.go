package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
)

// soakPlan is how much churn one soak run applies. `make e2e` runs the
// short default; `make soak` the full one (see e2e/soak.mk).
type soakPlan struct {
	kubelet, containerd, kills int
	budget                     time.Duration
}

func soakPlanFromEnv(t *testing.T) soakPlan {
	t.Helper()
	p := soakPlan{kubelet: 5, containerd: 3, kills: 2, budget: 15 * time.Minute}
	for env, dst := range map[string]*int{"NVINJECT_SOAK_KUBELET": &p.kubelet, "NVINJECT_SOAK_CONTAINERD": &p.containerd, "NVINJECT_SOAK_KILLS": &p.kills} {
		if v := os.Getenv(env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 500 {
				t.Fatalf("%s=%q: give a count from 0 to 500", env, v)
			}
			*dst = n
		}
	}
	if v := os.Getenv("NVINJECT_SOAK_BUDGET"); v != "" {
		b, err := time.ParseDuration(v)
		if err != nil || b <= 0 || b > time.Hour {
			t.Fatalf("NVINJECT_SOAK_BUDGET=%q: give a duration up to 1h such as 15m", v)
		}
		p.budget = b
	}
	return p
}

// The soak keeps the vLLM stand-in Deployment (one GPU) running while
// kubelet restarts, containerd restarts, each nvinject daemon is SIGKILLed
// and CDI spec files churn, interleaved in a fixed random order. After
// every disruption it checks inside each running GPU container which GPU
// it has; after containerd restarts and daemon kills it also replaces the
// pod, so a new container goes through Allocate and the NRI check under
// churn. At the end no GPU may be missing from allocatable, no container
// may have had a wrong or missing GPU, and every kubelet restart and
// device plugin kill must have been followed by a registration.
func TestSoak(t *testing.T) {
	d := need(t)
	failOnKubeletRefusedRegister(t)
	plan := soakPlanFromEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), plan.budget)
	defer cancel()
	began := time.Now()
	t.Logf("soak: %d kubelet restarts, %d containerd restarts, %d SIGKILLs of each nvinject daemon, CDI spec churn; budget %s",
		plan.kubelet, plan.containerd, plan.kills, plan.budget)

	s := newSoak(t, d)
	s.boundCrashLoopBackOff(ctx)
	if _, err := d.RunVLLM(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.DeleteVLLM(context.Background()); err != nil {
			t.Error(err)
		}
	})
	s.checkGPUs(ctx, "start")
	stopChurn := s.churnCDI()

	var schedule []string
	for range plan.kubelet {
		schedule = append(schedule, "kubelet")
	}
	for range plan.containerd {
		schedule = append(schedule, "containerd")
	}
	for range plan.kills {
		schedule = append(schedule, "kill "+rig.DevicePlugin, "kill "+rig.NRIPlugin)
	}
	rand.New(rand.NewPCG(11, 6)).Shuffle(len(schedule), func(i, j int) { schedule[i], schedule[j] = schedule[j], schedule[i] })
	for i, step := range schedule {
		if ctx.Err() != nil {
			t.Errorf("soak budget %s ran out after %d of %d steps", plan.budget, i, len(schedule))
			break
		}
		label := fmt.Sprintf("step %d/%d %s", i+1, len(schedule), step)
		switch {
		case step == "kubelet":
			s.restartKubelet(ctx, label)
		case step == "containerd":
			s.restartContainerd(ctx, label)
			s.replaceGPUPod(ctx, label)
		default:
			s.kill(ctx, label, strings.TrimPrefix(step, "kill "))
			s.replaceGPUPod(ctx, label)
		}
		s.checkGPUs(ctx, label)
		s.keepEndedPluginLog(ctx, label)
	}
	churned := stopChurn()

	lost := s.finalAllocatable(ctx)
	s.checkGPUs(ctx, "end")
	s.report(time.Since(began), churned, lost)
}

// finalAllocatable waits for the node to offer its GPU again and returns
// how many GPUs are missing from allocatable.
func (s *soak) finalAllocatable(ctx context.Context) int64 {
	if err := s.d.WaitKubeletAllocatable(ctx, dep.DeviceID, time.Minute); err != nil {
		s.t.Errorf("end: %v", err)
	}
	var c, a int64
	err := rig.Poll(ctx, 200*time.Millisecond, func(ctx context.Context) error {
		var err error
		if c, a, err = s.d.NodeGPUs(ctx); err != nil {
			return err
		}
		if c != 1 || a != 1 {
			return fmt.Errorf("capacity %d allocatable %d", c, a)
		}
		return nil
	})
	if err != nil {
		s.t.Errorf("end: Node %s never showed capacity 1 and allocatable 1 again: %v", s.d.Node().Name(), err)
	}
	return 1 - a
}

// boundCrashLoopBackOff caps kubelet's restart backoff of crashed
// containers at 1 s for the soak (crashLoopBackOff.maxContainerRestartPeriod,
// beta and on by default in kubelet 1.37): 10 SIGKILLs of one container
// would otherwise wait out a backoff growing to 5 minutes. The node's
// kubelet config is restored afterwards.
func (s *soak) boundCrashLoopBackOff(ctx context.Context) {
	path := filepath.Join(s.d.Node().RunDir(), "kubelet-config.yaml")
	orig, err := os.ReadFile(path)
	if err != nil {
		s.t.Fatalf("read the node's kubelet config: %v", err)
	}
	if strings.Contains(string(orig), "crashLoopBackOff") {
		s.t.Fatalf("%s already sets crashLoopBackOff; the soak would not restore it", path)
	}
	soaked := string(orig) + "\ncrashLoopBackOff:\n  maxContainerRestartPeriod: 1s\n"
	if err := os.WriteFile(path, []byte(soaked), 0o644); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() {
		ctx := context.Background()
		if err := os.WriteFile(path, orig, 0o644); err != nil {
			s.t.Errorf("restore %s: %v", path, err)
			return
		}
		if err := s.d.Node().Restart(ctx, "kubelet"); err != nil {
			s.t.Errorf("restart kubelet with its own config again: %v", err)
		}
		if err := s.d.WaitKubeletAllocatable(ctx, dep.DeviceID, time.Minute); err != nil {
			s.t.Errorf("after restoring the kubelet config: %v", err)
		}
	})
	if err := s.d.Node().Restart(ctx, "kubelet"); err != nil {
		s.t.Fatal(err)
	}
	if err := s.d.WaitKubeletAllocatable(ctx, dep.DeviceID, time.Minute); err != nil {
		s.t.Fatal(err)
	}
}

// restartKubelet restarts kubelet and measures, from the new kubelet.sock's
// creation, when the device plugin logged its registration (its own
// millisecond timestamps: scraping /metrics through the pod network lags
// by seconds while kubelet restarts), when kubelet logged the Register
// request and its connection back to the plugin, and when kubelet's
// PodResources offers the GPU again.
func (s *soak) restartKubelet(ctx context.Context, label string) {
	s.kubeletRestarts++
	t0 := time.Now()
	if err := s.d.Node().Restart(ctx, "kubelet"); err != nil {
		s.t.Errorf("%s: %v", label, err)
		return
	}
	s.kubeletRestart = append(s.kubeletRestart, time.Since(t0))
	created, err := createdSince(ctx, "/var/lib/kubelet/device-plugins/kubelet.sock", t0)
	if err != nil {
		s.t.Errorf("%s: %v", label, err)
		return
	}
	if err := s.d.WaitKubeletAllocatable(ctx, dep.DeviceID, 30*time.Second); err != nil {
		s.t.Errorf("%s: %v", label, err)
		return
	}
	s.offered = append(s.offered, time.Since(created))
	at, ok := s.pluginLogged(ctx, created, "registered with kubelet")
	if !ok {
		s.t.Errorf("%s: the device plugin's log has no registration after kubelet.sock was created at %s", label, created.Format(time.RFC3339Nano))
		return
	}
	s.reRegistered++
	s.reRegister = append(s.reRegister, max(at.Sub(created), 0))
	if got, ok := s.kubeletGotRegister(created); ok {
		s.registerSent = append(s.registerSent, max(got.Sub(created), 0))
	}
	if got, ok := s.kubeletLogged(created, "Connected to new client"); ok {
		s.pluginDialed = append(s.pluginDialed, max(got.Sub(created), 0))
	}
}

// restartContainerd restarts containerd and measures, from the new NRI
// socket's creation, when nvinject-nri reports connected again.
func (s *soak) restartContainerd(ctx context.Context, label string) {
	smp := s.sample(ctx, rig.NRIPlugin, "nvinject_nri_connected")
	t0 := time.Now()
	if err := s.d.Node().Restart(ctx, "containerd"); err != nil {
		smp.stop()
		s.t.Errorf("%s: %v", label, err)
		return
	}
	s.containerdRestart = append(s.containerdRestart, time.Since(t0))
	created, err := createdSince(ctx, s.d.Node().NRISocket(), t0)
	if err != nil {
		smp.stop()
		s.t.Errorf("%s: %v", label, err)
		return
	}
	at, ok := smp.untilAfter(created, 30*time.Second, func(v float64, up bool) bool { return up && v == 1 })
	smp.stop()
	if !ok {
		s.t.Errorf("%s: nvinject-nri did not reconnect within 30s of containerd's NRI socket", label)
		return
	}
	s.nriReconnect = append(s.nriReconnect, max(at.Sub(created), 0))
}

// kill SIGKILLs the daemon of DaemonSet name and measures until the new
// process serves again: registered with kubelet (device plugin) or
// connected to NRI (nvinject-nri).
func (s *soak) kill(ctx context.Context, label, name string) {
	series, want := "nvinject_nri_connected", func(v float64) bool { return v == 1 }
	if name == rig.DevicePlugin {
		series, want = `nvinject_device_plugin_registrations_total{result="ok"}`, func(v float64) bool { return v >= 1 }
	}
	pid, err := s.containerPID(ctx, name)
	if err != nil {
		s.t.Errorf("%s: %v", label, err)
		return
	}
	smp := s.sample(ctx, name, series)
	defer smp.stop()
	t0 := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		s.t.Errorf("%s: SIGKILL %d: %v", label, pid, err)
		return
	}
	s.kills[name]++
	down, ok := smp.untilAfter(t0, 10*time.Second, func(_ float64, up bool) bool { return !up })
	if !ok {
		s.t.Errorf("%s: %s still answered 10s after SIGKILL of pid %d", label, name, pid)
		return
	}
	at, ok := smp.untilAfter(down, time.Minute, func(v float64, up bool) bool { return up && want(v) })
	if !ok {
		s.t.Errorf("%s: %s did not come back within a minute of SIGKILL", label, name)
		return
	}
	s.killBack[name] = append(s.killBack[name], at.Sub(t0))
	if name == rig.DevicePlugin {
		s.reRegisteredAfterKill++
		if err := s.d.WaitKubeletAllocatable(ctx, dep.DeviceID, 30*time.Second); err != nil {
			s.t.Errorf("%s: %v", label, err)
		}
	}
}

// replaceGPUPod deletes the Deployment's Ready pod and waits for its
// replacement to be Ready: a new container through Allocate and the NRI
// check right after the disruption.
func (s *soak) replaceGPUPod(ctx context.Context, label string) {
	pods := s.gpuPods(ctx)
	t0 := time.Now()
	for _, p := range pods {
		if err := s.d.Kube().Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			s.t.Errorf("%s: delete %s: %v", label, p.Name, err)
		}
	}
	old := map[string]bool{}
	for _, p := range pods {
		old[p.Name] = true
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := rig.Poll(wctx, 250*time.Millisecond, func(ctx context.Context) error {
		for _, p := range s.gpuPods(ctx) {
			if !old[p.Name] && ready(&p) {
				return nil
			}
		}
		return fmt.Errorf("no new Ready GPU pod")
	})
	if err != nil {
		s.t.Errorf("%s: the replaced GPU pod did not become Ready: %v", label, err)
		return
	}
	s.podReady = append(s.podReady, time.Since(t0))
}

// checkGPUs looks inside every Ready GPU container: nvidia-smi run in it
// must list exactly the selected GPU, and the environment of its process
// (NVINJECT_GPU_UUID_*, as the stand-in reports it) must name only it.
func (s *soak) checkGPUs(ctx context.Context, label string) {
	for _, p := range s.gpuPods(ctx) {
		if !ready(&p) {
			continue
		}
		s.checked++
		// Right after a kubelet restart, kubelet may not know the pod yet
		// ("pod does not exist"): exec is retried for up to 30 s.
		var smi string
		var err error
		execCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_ = rig.Poll(execCtx, 250*time.Millisecond, func(ctx context.Context) error {
			smi, err = s.d.Kube().Exec(ctx, ns, p.Name, "", "nvidia-smi-sim", "--query-gpu=uuid", "--format=csv,noheader")
			if err != nil && strings.Contains(err.Error(), "pod does not exist") {
				s.execRetries++
				return err
			}
			return nil
		})
		cancel()
		if err != nil {
			s.t.Errorf("%s: nvidia-smi in %s: %v", label, p.Name, err)
			s.wrong = append(s.wrong, p.Name+": nvidia-smi failed: "+err.Error())
			continue
		}
		if got := strings.Fields(smi); !slices.Equal(got, []string{dep.UUID}) {
			s.wrong = append(s.wrong, fmt.Sprintf("%s (%s): nvidia-smi lists %v, want %s", p.Name, label, got, dep.UUID))
			s.t.Errorf("%s: %s sees GPUs %v, want exactly %s", label, p.Name, got, dep.UUID)
		}
		// The stand-in reports its own process environment's
		// NVINJECT_GPU_UUID_* in every completion.
		reply, err := rig.Complete(ctx, p.Status.PodIP)
		if err != nil {
			s.t.Errorf("%s: completion from %s: %v", label, p.Name, err)
			s.wrong = append(s.wrong, p.Name+": completion failed: "+err.Error())
			continue
		}
		var body struct {
			Nvinject struct {
				InjectedEnv []string `json:"injected_env"`
			} `json:"nvinject"`
		}
		if err := json.Unmarshal([]byte(reply), &body); err != nil {
			s.t.Errorf("%s: completion from %s: %v: %s", label, p.Name, err, reply)
			continue
		}
		var uuids []string
		for _, kv := range body.Nvinject.InjectedEnv {
			if _, v, ok := strings.Cut(kv, "="); ok {
				uuids = append(uuids, v)
			}
		}
		if !slices.Equal(uuids, []string{dep.UUID}) {
			s.wrong = append(s.wrong, fmt.Sprintf("%s (%s): env names GPUs %v, want %s", p.Name, label, uuids, dep.UUID))
			s.t.Errorf("%s: %s's environment names GPUs %v, want exactly %s", label, p.Name, uuids, dep.UUID)
		}
	}
}

// gpuPods lists the Deployment's pods and records every one that failed.
func (s *soak) gpuPods(ctx context.Context) []corev1.Pod {
	pods, err := s.d.Kube().Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: rig.VLLMSelector})
	if err != nil {
		s.t.Logf("list GPU pods: %v", err)
		return nil
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if why := failure(&p); why != "" {
			if _, seen := s.failed[p.Name]; !seen {
				s.failed[p.Name] = why
			}
		}
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodFailed {
			live = append(live, p)
		}
	}
	return live
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return p.DeletionTimestamp == nil
		}
	}
	return false
}

// failure says why a pod failed, or "" if it has not.
func failure(p *corev1.Pod) string {
	if p.Status.Phase == corev1.PodFailed {
		return fmt.Sprintf("%s: %s", p.Status.Reason, p.Status.Message)
	}
	for _, c := range p.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
			return fmt.Sprintf("%s: %s", w.Reason, w.Message)
		}
		if tm := c.LastTerminationState.Terminated; tm != nil && tm.ExitCode != 0 {
			return fmt.Sprintf("container exited %d (%s): %s", tm.ExitCode, tm.Reason, tm.Message)
		}
	}
	return ""
}
