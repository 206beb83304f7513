package scenarios

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
	"github.com/nvinject/nvinject/shared/contract"
)

// faultRow is one cell of the fault matrix as the table in deploy/README.md
// shows it.
type faultRow struct {
	strategy, fault string
	gpu, nonGPU     string
	kubelet         string
	recovery        time.Duration
}

// TestFaultMatrix drives nvinject-nri through each fault on the real node,
// for NVIDIA's device plugin's strategies and for the nri strategy: healthy, slow (a
// SIMULATED delay past --request-deadline), hung (SIGSTOP), killed and
// restarted by kubelet, disconnected (SIMULATED), and a second NRI plugin at
// a higher index adding a foreign GPU. For each it records the GPU and
// non-GPU pods' outcomes, kubelet's message and the time until a GPU pod
// starts again; no GPU pod may reach Running without passing nvinject's
// check.
func TestFaultMatrix(t *testing.T) {
	d := need(t)
	var rows []faultRow
	t.Cleanup(func() { t.Log("fault matrix:\n" + faultTable(rows)) })
	for _, strategy := range []string{"cdi-annotations,cdi-cri", string(contract.StrategyNRI)} {
		t.Run(strategy, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			setStrategy(t, ctx, d, strategy)
			f := &faults{t: t, ctx: ctx, d: d, strategy: strategy}
			for _, cell := range []struct {
				name string
				run  func() faultRow
			}{
				{"healthy", f.healthy}, {"slow", f.slow}, {"hung", f.hung}, {"killed", f.killed},
				{"disconnected", f.disconnected}, {"foreign GPU plugin", f.foreign},
			} {
				t0 := time.Now()
				row := cell.run()
				row.strategy, row.fault = strategy, cell.name
				rows = append(rows, row)
				t.Logf("%s / %s (cell took %s): GPU pod %s; non-GPU pod %s; kubelet: %s; a fresh GPU pod ran %s after the fault ended", strategy, cell.name,
					time.Since(t0).Round(time.Second), row.gpu, row.nonGPU, row.kubelet, row.recovery.Round(100*time.Millisecond))
			}
		})
	}
}

// setStrategy sets the device plugin's DEVICE_LIST_STRATEGY and waits for
// the rollout; the example's value is restored when t ends.
func setStrategy(t *testing.T, ctx context.Context, d *rig.Deployer, strategy string) {
	t.Helper()
	set := func(ctx context.Context, v string) error {
		if _, err := d.Kube().Kubectl(ctx, "", "-n", rig.Namespace, "set", "env", "daemonset/"+rig.DevicePlugin, "DEVICE_LIST_STRATEGY="+v); err != nil {
			return err
		}
		if _, err := d.Kube().Kubectl(ctx, "", "-n", rig.Namespace, "rollout", "status", "daemonset/"+rig.DevicePlugin, "--timeout=2m"); err != nil {
			return err
		}
		return d.WaitReady(ctx, dep, 2*time.Minute)
	}
	if err := set(ctx, strategy); err != nil {
		t.Fatalf("set DEVICE_LIST_STRATEGY=%s: %v", strategy, err)
	}
	t.Cleanup(func() {
		if err := set(context.Background(), "cdi-annotations,cdi-cri"); err != nil {
			t.Errorf("restore DEVICE_LIST_STRATEGY: %v", err)
		}
	})
}

type faults struct {
	t        *testing.T
	ctx      context.Context
	d        *rig.Deployer
	strategy string
	n        int
}

func (f *faults) name(kind string) string {
	f.n++
	s := strings.NewReplacer(",", "-", "cdi-annotations", "ann").Replace(f.strategy)
	return fmt.Sprintf("fault-%s-%s-%d", s, kind, f.n)
}

// outcome waits until pod name runs or kubelet reports CreateContainerError
// and says which; a GPU pod that runs must see exactly the selected GPU
// and have gone through nvinject-nri (its annotation on the container).
func (f *faults) outcome(name string, gpu bool) (string, string, time.Duration) {
	f.t.Helper()
	t0 := time.Now()
	p := waitPod(f.t, f.ctx, name, 2*time.Minute, "Running or CreateContainerError", func(p *corev1.Pod) bool { return running(p) || createError(p) })
	took := time.Since(t0)
	if running(p) {
		if gpu {
			if got := containerGPUs(f.t, f.ctx, name); !slices.Equal(got, []string{dep.UUID}) {
				f.t.Errorf("GPU pod %s sees %v, want %s", name, got, dep.UUID)
			}
			if got := f.checkedUUIDs(p); got != dep.UUID {
				f.t.Errorf("GPU pod %s runs with %s=%q, want %s: it started without nvinject-nri's check", name, contract.GPUUUIDsAnnotation, got, dep.UUID)
			}
		}
		return "Running", "", took
	}
	_, msg := waitingReason(p)
	return "CreateContainerError", msg, took
}

// checkedUUIDs reads, through the CRI, the annotation nvinject-nri puts on
// each GPU container it adjusted (and so validated in the same call).
func (f *faults) checkedUUIDs(p *corev1.Pod) string {
	f.t.Helper()
	if len(p.Status.ContainerStatuses) == 0 {
		return ""
	}
	_, id, _ := strings.Cut(p.Status.ContainerStatuses[0].ContainerID, "://")
	out, err := crictl(f.ctx, f.d, "inspect", id)
	if err != nil {
		f.t.Fatal(err)
	}
	var info struct {
		Info struct {
			RuntimeSpec struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		f.t.Fatalf("crictl inspect %s: %v", id, err)
	}
	return info.Info.RuntimeSpec.Annotations[contract.GPUUUIDsAnnotation]
}

// freshGPUPod creates GPU pods until one runs (each failure deleted, so the
// one GPU is free again) and returns how long that took from since.
func (f *faults) freshGPUPod(since time.Time) time.Duration {
	f.t.Helper()
	for {
		name := f.name("gpu")
		createPod(f.t, f.ctx, name, gpuPod)
		got, msg, _ := f.outcome(name, true)
		if got == "Running" {
			d := time.Since(since)
			deletePod(f.t, name)
			return d
		}
		deletePod(f.t, name)
		if time.Since(since) > 3*time.Minute {
			f.t.Fatalf("no GPU pod runs 3m after the fault ended: %s", msg)
		}
	}
}

// pair runs a GPU pod and a non-GPU pod and reports both outcomes.
func (f *faults) pair() (gpu, nonGPU, kubelet string) {
	f.t.Helper()
	g, n := f.name("gpu"), f.name("plain")
	createPod(f.t, f.ctx, g, gpuPod)
	gpuOut, gpuMsg, _ := f.outcome(g, true)
	deletePod(f.t, g)
	createPod(f.t, f.ctx, n, podSpec{})
	plainOut, plainMsg, took := f.outcome(n, false)
	deletePod(f.t, n)
	return gpuOut, fmt.Sprintf("%s (%s)", plainOut, took.Round(100*time.Millisecond)), firstNonEmpty(gpuMsg, plainMsg)
}

func (f *faults) healthy() faultRow {
	gpu, plain, msg := f.pair()
	if gpu != "Running" || !strings.HasPrefix(plain, "Running") {
		f.t.Errorf("healthy: GPU pod %s, non-GPU pod %s: %s", gpu, plain, msg)
	}
	return faultRow{gpu: gpu, nonGPU: plain, kubelet: "-"}
}

func (f *faults) slow() faultRow {
	f.simFault("delay", "d=3s")
	gpu, plain, msg := f.pair()
	f.simFault("delay", "d=0s")
	end := time.Now()
	if gpu != "CreateContainerError" || !strings.Contains(msg, "--request-deadline") {
		f.t.Errorf("slow: GPU pod %s, kubelet %q; want nvinject's deadline refusal", gpu, msg)
	}
	if !strings.HasPrefix(plain, "Running") {
		f.t.Errorf("slow: non-GPU pod %s", plain)
	}
	return faultRow{gpu: gpu, nonGPU: plain, kubelet: msg, recovery: f.freshGPUPod(end)}
}

// hung stops nvinject-nri with SIGSTOP. The first CreateContainer after
// that waits out plugin_request_timeout and fails whatever the pod (the
// closed plugin is still a validator for that call); then the plugin is
// gone and the default validator refuses only pods that require it.
func (f *faults) hung() faultRow {
	pid := f.nriPID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		f.t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				f.t.Errorf("SIGCONT nvinject-nri: %v", err)
			}
		}
	}
	defer resume()
	n := f.name("plain")
	t0 := time.Now()
	createPod(f.t, f.ctx, n, podSpec{})
	firstMsg := f.firstError(n)
	// kubelet retries the creation after its back-off.
	waitPod(f.t, f.ctx, n, 2*time.Minute, "Running", running)
	took := time.Since(t0)
	deletePod(f.t, n)
	g := f.name("gpu")
	createPod(f.t, f.ctx, g, gpuPod)
	gpuOut, gpuMsg, _ := f.outcome(g, true)
	deletePod(f.t, g)
	resume()
	end := time.Now()
	if gpuOut != "CreateContainerError" || !strings.Contains(gpuMsg, "nvinject") {
		f.t.Errorf("hung: GPU pod %s (%s); want refused", gpuOut, gpuMsg)
	}
	plain := fmt.Sprintf("Running after %s", took.Round(100*time.Millisecond))
	if firstMsg != "" {
		plain = fmt.Sprintf("first attempt refused (%s), %s", firstMsg, plain)
	}
	return faultRow{gpu: gpuOut, nonGPU: plain, kubelet: gpuMsg, recovery: f.freshGPUPod(end)}
}

// firstError waits briefly for pod name's first CreateContainerError and
// returns its message ("" if it ran first).
func (f *faults) firstError(name string) string {
	p := waitPod(f.t, f.ctx, name, 2*time.Minute, "Running or CreateContainerError", func(p *corev1.Pod) bool { return running(p) || createError(p) })
	if running(p) {
		return ""
	}
	_, msg := waitingReason(p)
	return msg
}

func (f *faults) killed() faultRow {
	if err := syscall.Kill(f.nriPID(), syscall.SIGKILL); err != nil {
		f.t.Fatal(err)
	}
	killedAt := time.Now()
	gpu, plain, msg := f.pair()
	if gpu == "Running" {
		f.t.Logf("killed: kubelet had restarted nvinject-nri before the GPU pod was created")
	}
	return faultRow{gpu: gpu, nonGPU: plain, kubelet: firstNonEmpty(msg, "-"), recovery: f.freshGPUPod(killedAt)}
}

func (f *faults) disconnected() faultRow {
	const away = 10 * time.Second
	f.simFault("disconnect", "for="+away.String())
	start := time.Now()
	gpu, plain, msg := f.pair()
	if gpu != "CreateContainerError" || !strings.Contains(msg, `required plugin "nvinject" not present`) {
		f.t.Errorf("disconnected: GPU pod %s (%s); want the default validator's refusal", gpu, msg)
	}
	return faultRow{gpu: gpu, nonGPU: plain, kubelet: msg, recovery: f.freshGPUPod(start.Add(away))}
}

// foreign runs the test equipment nri-foreign-gpu (index 90, after
// nvinject's 10), which adds /dev/nvidia1 to every container.
func (f *faults) foreign() faultRow {
	cmd := exec.Command(f.d.Bin("nri-foreign-gpu"), "--socket-path", f.d.Node().NRISocket(), "--plugin-idx", "90", "--minor", "1")
	logs, err := os.Create(filepath.Join(f.t.TempDir(), "foreign.log"))
	if err != nil {
		f.t.Fatal(err)
	}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	}
	defer stop()
	f.waitLog(logs.Name(), "registered with NRI")
	gpu, plain, msg := f.pair()
	stop()
	end := time.Now()
	if gpu != "CreateContainerError" || !strings.Contains(msg, "/dev/nvidia1") {
		f.t.Errorf("foreign GPU: GPU pod %s (%s); want nvinject's foreign-gpu refusal", gpu, msg)
	}
	if !strings.HasPrefix(plain, "CreateContainerError") {
		f.t.Errorf("foreign GPU: non-GPU pod %s; the foreign /dev/nvidia1 must refuse it too", plain)
	}
	return faultRow{gpu: gpu, nonGPU: plain, kubelet: msg, recovery: f.freshGPUPod(end)}
}

func (f *faults) waitLog(path, text string) {
	f.t.Helper()
	err := rig.Poll(f.ctx, 100*time.Millisecond, func(context.Context) error {
		b, err := os.ReadFile(path)
		if err != nil || !strings.Contains(string(b), text) {
			return fmt.Errorf("%s does not say %q yet: %s", path, text, b)
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// simFault POSTs to nvinject-nri's SIMULATION-only /debug/sim/<action>.
func (f *faults) simFault(action, query string) {
	f.t.Helper()
	u, err := f.d.MetricsURL(f.ctx, rig.NRIPlugin)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := post(f.ctx, strings.TrimSuffix(u, "/metrics")+"/debug/sim/"+action+"?"+query); err != nil {
		f.t.Fatal(err)
	}
}

// nriPID finds nvinject-nri's host PID: the process whose cgroup names the
// running container of the DaemonSet's pod.
func (f *faults) nriPID() int {
	f.t.Helper()
	var id string
	err := rig.Poll(f.ctx, 200*time.Millisecond, func(ctx context.Context) error {
		p, err := f.d.DaemonSetPod(ctx, rig.NRIPlugin)
		if err != nil {
			return err
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.State.Running != nil && c.Ready {
				_, id, _ = strings.Cut(c.ContainerID, "://")
				return nil
			}
		}
		return fmt.Errorf("nvinject-nri pod %s has no ready container", p.Name)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, cg := range procs {
		b, err := os.ReadFile(cg)
		if err != nil || !strings.Contains(string(b), id) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(cg)))
		if comm, _ := os.ReadFile(filepath.Join(filepath.Dir(cg), "comm")); strings.TrimSpace(string(comm)) == "nvinject-nri" {
			return pid
		}
	}
	f.t.Fatalf("no nvinject-nri process in container %s", id)
	return 0
}

// short drops the prefix containerd puts before every NRI refusal and
// cuts the rest for a table cell.
func short(msg string) string {
	msg = strings.ReplaceAll(msg, "failed to create containerd container: failed to get NRI adjustment for container: ", "")
	msg = strings.ReplaceAll(msg, "|", "/")
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	return msg
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// faultTable renders rows as the markdown table of deploy/README.md.
func faultTable(rows []faultRow) string {
	var b strings.Builder
	w := bufio.NewWriter(&b)
	fmt.Fprintln(w, "| strategy | fault | GPU pod | non-GPU pod | kubelet shows | GPU pods again after |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	for _, r := range rows {
		again := r.recovery.Round(100 * time.Millisecond).String()
		if r.fault == "healthy" {
			again = "-"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.strategy, r.fault, r.gpu, short(r.nonGPU), short(r.kubelet), again)
	}
	w.Flush()
	return b.String()
}

func post(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return string(body), fmt.Errorf("POST %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}
