package scenarios

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvinject/nvinject/e2e/harness/rig"
)

// soak holds one soak run's figures.
type soak struct {
	t *testing.T
	d *rig.Deployer

	kubeletRestarts, reRegistered, reRegisteredAfterKill int
	kubeletRestart, reRegister, registerSent, offered    []time.Duration
	pluginDialed                                         []time.Duration
	containerdRestart, nriReconnect                      []time.Duration
	kills                                                map[string]int
	killBack                                             map[string][]time.Duration
	podReady                                             []time.Duration
	checked, execRetries                                 int
	wrong                                                []string
	failed                                               map[string]string
	// pluginLogs is the log of each device plugin container that ended
	// during the soak, by container ID; firstRestarts is the container's
	// restart count when the soak began.
	pluginLogs    map[string]string
	firstRestarts int32
}

func newSoak(t *testing.T, d *rig.Deployer) *soak {
	s := &soak{t: t, d: d, kills: map[string]int{}, killBack: map[string][]time.Duration{}, failed: map[string]string{}, pluginLogs: map[string]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := s.pluginContainer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.firstRestarts = c.RestartCount
	return s
}

// pluginContainer is the device plugin's container status and its pod's name.
func (s *soak) pluginContainer(ctx context.Context) (corev1.ContainerStatus, string, error) {
	p, err := s.d.DaemonSetPod(ctx, rig.DevicePlugin)
	if err != nil {
		return corev1.ContainerStatus{}, "", err
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == pluginContainerName {
			return c, p.Name, nil
		}
	}
	return corev1.ContainerStatus{}, "", fmt.Errorf("pod %s has no %s container status", p.Name, pluginContainerName)
}

// pluginContainerName is the device plugin DaemonSet's container (deploy/base).
const pluginContainerName = "device-plugin"

// keepEndedPluginLog reads the log of the device plugin container that
// ended last (`kubectl logs --previous`), once per container: kubelet keeps
// only the last ended container's log, and removes it at its next
// container GC, so a SIGKILLed instance's Register attempts are otherwise
// lost. Called after every soak step.
func (s *soak) keepEndedPluginLog(ctx context.Context, label string) {
	c, pod, err := s.pluginContainer(ctx)
	if err != nil {
		s.t.Errorf("%s: %v", label, err)
		return
	}
	tm := c.LastTerminationState.Terminated
	if tm == nil || tm.ContainerID == "" {
		return
	}
	if _, kept := s.pluginLogs[tm.ContainerID]; kept {
		return
	}
	log, err := s.podLog(ctx, pod, true)
	if err != nil {
		s.t.Errorf("%s: the ended device plugin container's log: %v", label, err)
		return
	}
	s.pluginLogs[tm.ContainerID] = log
}

// podLog reads a device plugin pod's container log through the API
// server, the previous (ended) container's when previous is set. Right
// after a kubelet restart kubelet may not serve it yet: retried for up to
// 30 s.
func (s *soak) podLog(ctx context.Context, pod string, previous bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out []byte
	err := rig.Poll(ctx, 250*time.Millisecond, func(ctx context.Context) error {
		var err error
		out, err = s.d.Kube().Client.CoreV1().Pods(rig.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: pluginContainerName, Previous: previous}).DoRaw(ctx)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("logs of %s/%s (previous=%v): %w", rig.Namespace, pod, previous, err)
	}
	return string(out), nil
}

// sampleEvery is how often a sampler scrapes /metrics; the latencies it
// measures are at most this much (plus one loopback HTTP round trip) late.
const sampleEvery = 10 * time.Millisecond

type sample struct {
	at time.Time
	v  float64
	up bool
}

// sampler scrapes one series of a DaemonSet pod's /metrics until stopped.
type sampler struct {
	mu      sync.Mutex
	samples []sample
	cancel  context.CancelFunc
	done    chan struct{}
}

func (s *soak) sample(ctx context.Context, daemonSet, series string) *sampler {
	s.t.Helper()
	url, err := s.d.MetricsURL(ctx, daemonSet)
	if err != nil {
		s.t.Fatalf("metrics of %s: %v", daemonSet, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	smp := &sampler{cancel: cancel, done: make(chan struct{})}
	client := &http.Client{Timeout: time.Second}
	go func() {
		defer close(smp.done)
		tick := time.NewTicker(sampleEvery)
		defer tick.Stop()
		for {
			v, up := scrape(ctx, client, url, series)
			smp.mu.Lock()
			smp.samples = append(smp.samples, sample{at: time.Now(), v: v, up: up})
			smp.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return smp
}

func scrape(ctx context.Context, client *http.Client, url, series string) (float64, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, false
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, false
	}
	return metricValue(string(body), series), true
}

func (smp *sampler) stop() {
	smp.cancel()
	<-smp.done
}

// untilAfter returns the time of the first sample taken after from that
// satisfies cond, waiting up to timeout for it.
func (smp *sampler) untilAfter(from time.Time, timeout time.Duration, cond func(v float64, up bool) bool) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	seen := 0
	for {
		smp.mu.Lock()
		for ; seen < len(smp.samples); seen++ {
			if s := smp.samples[seen]; s.at.After(from) && cond(s.v, s.up) {
				smp.mu.Unlock()
				return s.at, true
			}
		}
		smp.mu.Unlock()
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		select {
		case <-smp.done:
			return time.Time{}, false
		case <-time.After(sampleEvery / 2):
		}
	}
}

// ctime is when the file at path was created or last changed: for a
// socket, when its server bound it.
// createdSince waits until path is a file made after t0 (a restarted
// daemon's socket: the daemon may report healthy before it re-created it,
// and the old file's ctime would date the restart from the previous one)
// and returns its ctime.
func createdSince(ctx context.Context, path string, t0 time.Time) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var at time.Time
	err := rig.Poll(ctx, 5*time.Millisecond, func(context.Context) error {
		var err error
		if at, err = ctime(path); err != nil {
			return err
		}
		if !at.After(t0) {
			return fmt.Errorf("%s not re-created since %s (ctime %s)", path, t0.Format(time.RFC3339Nano), at.Format(time.RFC3339Nano))
		}
		return nil
	})
	return at, err
}

func ctime(path string) (time.Time, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return time.Time{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return time.Unix(st.Ctim.Sec, st.Ctim.Nsec), nil
}

// containerPID is the host PID of the running container of DaemonSet name,
// as containerd's CRI reports it.
func (s *soak) containerPID(ctx context.Context, name string) (int, error) {
	container := map[string]string{rig.DevicePlugin: "device-plugin", rig.NRIPlugin: "nri"}[name]
	out, err := crictl(ctx, s.d, "ps", "-q", "--state", "Running",
		"--label", "io.kubernetes.pod.namespace="+rig.Namespace, "--label", "io.kubernetes.container.name="+container)
	if err != nil {
		return 0, fmt.Errorf("find %s's container: %w", name, err)
	}
	ids := strings.Fields(out)
	if len(ids) != 1 {
		return 0, fmt.Errorf("crictl ps finds %d running %s containers, want 1", len(ids), container)
	}
	out, err = crictl(ctx, s.d, "inspect", "-o", "go-template", "--template", "{{.info.pid}}", ids[0])
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("crictl inspect %s: pid %q", ids[0], out)
	}
	return pid, nil
}

// churnCDI writes and deletes CDI spec files of a kind nobody requests in
// the node's CDI dir, beside nvinject's own, until the returned function
// is called; that stops it, removes its files and says what it did.
func (s *soak) churnCDI() func() string {
	dir := s.d.Node().CDIDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var writes, deletes int
	const files = 40
	path := func(i int) string { return filepath.Join(dir, fmt.Sprintf("soak-churn-%02d.yaml", i%files)) }
	go func() {
		defer close(done)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			spec := fmt.Sprintf("cdiVersion: \"0.6.0\"\nkind: soak.example.com/churn\ndevices:\n  - name: d%d\n    containerEdits:\n      env: [\"SOAK_CHURN=%d\"]\n", i%files, i)
			if os.WriteFile(path(i), []byte(spec), 0o644) == nil {
				writes++
			}
			if os.Remove(path(i+files/2)) == nil {
				deletes++
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() string {
		cancel()
		<-done
		for i := range files {
			_ = os.Remove(path(i))
		}
		return fmt.Sprintf("%d writes and %d deletes of %d spec files in %s, every 25 ms", writes, deletes, files, dir)
	}
}

// stats renders n, p50, p99 and max of d.
func stats(d []time.Duration) string {
	if len(d) == 0 {
		return "n=0"
	}
	c := slices.Clone(d)
	slices.Sort(c)
	at := func(p float64) time.Duration { return c[int(p*float64(len(c)-1))] }
	r := func(x time.Duration) string { return x.Round(100 * time.Microsecond).String() }
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(c), r(at(0.5)), r(at(0.99)), r(c[len(c)-1]))
}

func (s *soak) report(took time.Duration, churned string, lost int64) {
	t := s.t
	dp, nri := rig.DevicePlugin, rig.NRIPlugin
	t.Logf("soak figures (took %s; NRI and SIGKILL latencies observed by scraping /metrics every %s through the pod network):", took.Round(time.Second), sampleEvery)
	t.Logf("  kubelet restarts: %d, each followed by re-registration: %d", s.kubeletRestarts, s.reRegistered)
	t.Logf("    restart (SIGTERM to kubelet healthy): %s", stats(s.kubeletRestart))
	t.Logf("    re-register (new kubelet.sock -> the plugin logged \"registered with kubelet\", ms timestamps): %s", stats(s.reRegister))
	t.Logf("      kubelet logged the Register request (\"Got registration request\"): %s", stats(s.registerSent))
	t.Logf("      kubelet logged its connection back to the plugin (\"Connected to new client\"): %s", stats(s.pluginDialed))
	t.Logf("    GPU offered again (new kubelet.sock -> PodResources allocatable, polled every 100 ms): %s", stats(s.offered))
	t.Logf("  containerd restarts: %d", len(s.containerdRestart))
	t.Logf("    restart (SIGTERM to containerd ready): %s", stats(s.containerdRestart))
	t.Logf("    NRI reconnect (new NRI socket -> nvinject_nri_connected 1): %s", stats(s.nriReconnect))
	t.Logf("  SIGKILL %s: %d; back and registered: %s", dp, s.kills[dp], stats(s.killBack[dp]))
	t.Logf("  SIGKILL %s: %d; back and connected: %s", nri, s.kills[nri], stats(s.killBack[nri]))
	t.Logf("  GPU pod replaced after a disruption until Ready: %s", stats(s.podReady))
	t.Logf("  CDI spec churn: %s", churned)
	t.Logf("  GPU containers checked inside (nvidia-smi and env): %d; with a wrong or missing GPU: %d (exec retried %d times while a restarted kubelet did not know the pod yet)", s.checked, len(s.wrong), s.execRetries)
	for _, w := range s.wrong {
		t.Logf("    %s", w)
	}
	t.Logf("  GPUs lost from allocatable at the end: %d", lost)
	t.Logf("  %s", s.registerCalls())
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range s.failed {
			if !yield(n) {
				return
			}
		}
	})
	t.Logf("  GPU pods that failed: %d", len(names))
	for _, n := range names {
		t.Logf("    %s: %s", n, s.failed[n])
	}
	if lost != 0 {
		t.Errorf("%d GPUs lost from allocatable", lost)
	}
	if len(s.wrong) > 0 {
		t.Errorf("%d GPU container checks found a wrong or missing GPU", len(s.wrong))
	}
	if s.reRegistered != s.kubeletRestarts {
		t.Errorf("only %d of %d kubelet restarts were followed by re-registration", s.reRegistered, s.kubeletRestarts)
	}
	if s.reRegisteredAfterKill != s.kills[dp] {
		t.Errorf("only %d of %d device plugin SIGKILLs were followed by registration", s.reRegisteredAfterKill, s.kills[dp])
	}
}

// registerCalls counts the device plugin's Register calls, successful and
// failed, in the log of every container instance the soak ran: those that
// ended (kept by keepEndedPluginLog) and the running one. An instance whose
// log was not read is an error, since the count would be short.
func (s *soak) registerCalls() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pod, err := s.pluginContainer(ctx)
	if err != nil {
		s.t.Errorf("device plugin log: %v", err)
		return "device plugin log: " + err.Error()
	}
	current, err := s.podLog(ctx, pod, false)
	if err != nil {
		s.t.Errorf("device plugin log: %v", err)
		return "device plugin log: " + err.Error()
	}
	logs := []string{current}
	for _, l := range s.pluginLogs {
		logs = append(logs, l)
	}
	if want := int(c.RestartCount-s.firstRestarts) + 1; len(logs) != want {
		s.t.Errorf("read the logs of %d device plugin containers, but %d ran during the soak (restart count %d -> %d): the Register count misses some", len(logs), want, s.firstRestarts, c.RestartCount)
	}
	ok, failed := 0, 0
	seen := map[string]bool{}
	var first []string
	for _, log := range logs {
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "registered with kubelet") {
				ok++
			}
			if !strings.Contains(line, "register with kubelet failed") {
				continue
			}
			failed++
			_, why, _ := strings.Cut(line, "register with kubelet failed")
			why, _, _ = strings.Cut(why, "retry_in")
			if len(why) > 400 {
				why = why[:400] + "..."
			}
			if !seen[why] && len(first) < 3 {
				seen[why] = true
				first = append(first, why)
			}
		}
	}
	return fmt.Sprintf("Register calls in the device plugin's log, %d container instances (%d ended, read as the previous log): %d ok, %d failed %q", len(logs), len(logs)-1, ok, failed, first)
}

// kubeletGotRegister is when kubelet's log says it got the first Register
// request from a device plugin at or after from.
func (s *soak) kubeletGotRegister(from time.Time) (time.Time, bool) {
	return s.kubeletLogged(from, "Got registration request from device plugin")
}

// kubeletLogged is when kubelet's log first has a line containing msg at
// or after from (klog's microsecond timestamp, local time).
func (s *soak) kubeletLogged(from time.Time, msg string) (time.Time, bool) {
	data, err := os.ReadFile(s.d.Node().LogFile("kubelet"))
	if err != nil {
		return time.Time{}, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, msg) || len(line) < 21 {
			continue
		}
		// I1201 09:50:01.123456 ...
		at, err := time.ParseInLocation("0102 15:04:05.000000", line[1:21], time.Local)
		if err != nil {
			continue
		}
		at = at.AddDate(from.Year(), 0, 0)
		if !at.Before(from.Add(-time.Millisecond)) {
			return at, true
		}
	}
	return time.Time{}, false
}

// pluginLogged is when the running device plugin's log first has a line
// containing msg at or after from (slog's time, text or JSON).
func (s *soak) pluginLogged(ctx context.Context, from time.Time, msg string) (time.Time, bool) {
	_, pod, err := s.pluginContainer(ctx)
	if err != nil {
		return time.Time{}, false
	}
	out, err := s.podLog(ctx, pod, false)
	if err != nil {
		s.t.Logf("device plugin log: %v", err)
		return time.Time{}, false
	}
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var stamp string
		if _, rest, ok := strings.Cut(line, "time="); ok {
			stamp, _, _ = strings.Cut(rest, " ")
		} else if _, rest, ok := strings.Cut(line, `"time":"`); ok {
			stamp, _, _ = strings.Cut(rest, `"`)
		}
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err == nil && !at.Before(from.Add(-time.Millisecond)) {
			return at, true
		}
	}
	return time.Time{}, false
}
