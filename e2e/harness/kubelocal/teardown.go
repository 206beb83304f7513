package kubelocal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/e2e/internal/proc"
	"github.com/nvinject/nvinject/shared/logging"
)

// hostDevicePlugins is hard-coded in kubelet; the node removes only kubelet's own files there.
const hostDevicePlugins = "/var/lib/kubelet/device-plugins"

// Down stops the node and removes everything it left on the host: pods, processes,
// mounts, cgroups, the CNI bridge. Logs stay in <run dir>/logs. It is safe to repeat.
func (n *Node) Down(ctx context.Context) error {
	if _, err := os.Stat(n.layout.dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	n.useRecordedBin()
	var errs []error
	stop := func(name string) {
		if err := proc.Stop(ctx, n.layout.pidFile(name), 15*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", name, err))
		}
	}
	// Controllers first, so nothing recreates the pods deleted next.
	stop("kube-controller-manager")
	stop("kube-scheduler")
	if err := n.deletePods(ctx); err != nil {
		n.log.Warn("deleting pods through the API server failed; removing sandboxes directly", logging.Err(err))
	}
	for _, w := range n.Workers() {
		errs = append(errs, w.down(ctx)...)
	}
	for _, name := range []string{"kubelet", "kube-apiserver", "etcd"} {
		stop(name)
	}
	n.removeSandboxes(ctx)
	stop("containerd")
	for _, pid := range hostclean.Processes("containerd-shim", n.layout.containerdSocket()) {
		n.log.Warn("killing leftover shim", "pid", pid)
		proc.Kill(ctx, pid)
	}
	if err := hostclean.UnmountUnder(n.layout.dir); err != nil {
		errs = append(errs, err)
	}
	// Host-wide state may belong to another node started since; leave it to its owner.
	// A control plane alone made none, and a local node beside it owns what there is.
	switch {
	case n.controlPlaneOnly:
	case n.ownsHost():
		errs = append(errs, n.removeHostLeftovers(ctx)...)
		// Only one kubelet can run per host (its device-plugin dir is fixed), so kubepods is ours.
		if err := hostclean.KillAndRemoveCgroups("kubepods", "kubepods.slice"); err != nil {
			errs = append(errs, err)
		}
		// containerd names cgroups after its namespace; remove k8s.io only where empty, as
		// another containerd on the host may use it.
		_ = hostclean.RemoveCgroups("k8s.io")
		n.releaseHost()
	default:
		n.log.Warn("another local node owns the host-wide state; leaving it", "owner", currentOwner())
	}
	// Device nodes are listed in this run dir, so they are this node's whoever owns the host now.
	if err := hostclean.RemoveDevices(n.layout.hostDevices()); err != nil {
		errs = append(errs, err)
	}
	if err := hostclean.RemoveRunDir(n.layout.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// deletePods removes static pod manifests and deletes every pod while kubelet still runs,
// so kubelet stops containers and unmounts volumes the regular way.
func (n *Node) deletePods(ctx context.Context) error {
	if entries, err := os.ReadDir(n.layout.staticPods()); err == nil {
		for _, e := range entries {
			_ = os.Remove(filepath.Join(n.layout.staticPods(), e.Name()))
		}
	}
	if pid, _ := proc.Find(n.layout.pidFile("kube-apiserver")); pid == 0 {
		return nil
	}
	if pid, _ := proc.Find(n.layout.pidFile("kubelet")); pid == 0 {
		return nil
	}
	c, err := n.apiClient()
	if err != nil {
		return err
	}
	pods, err := c.pods(ctx)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if err := c.deletePod(ctx, p[0], p[1], 2); err != nil {
			n.log.Warn("delete pod", "pod", p[0]+"/"+p[1], logging.Err(err))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		pods, err := c.pods(ctx)
		if err == nil && len(pods) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d pods still present after 60s (last error: %v); see %s", len(pods), err, n.layout.logFile("kubelet"))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// removeSandboxes stops and removes every pod sandbox containerd still has.
func (n *Node) removeSandboxes(ctx context.Context) {
	if pid, _ := proc.Find(n.layout.pidFile("containerd")); pid == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, n.tool("crictl"), "--runtime-endpoint", "unix://"+n.layout.containerdSocket(),
		"rmp", "--all", "--force").CombinedOutput()
	if err != nil {
		n.log.Warn("crictl rmp failed", logging.Err(err), "output", strings.TrimSpace(string(out)))
	}
}

// removeHostLeftovers removes what kubelet and CNI create outside the run dir.
func (n *Node) removeHostLeftovers(ctx context.Context) []error {
	var errs []error
	if _, err := os.Stat("/sys/class/net/" + cniBridge); err == nil {
		if out, err := exec.CommandContext(ctx, "ip", "link", "delete", cniBridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w: %s", cniBridge, err, out))
		}
	}
	if _, err := os.Stat("/sys/class/net/" + nodesBridge); err == nil {
		if out, err := exec.CommandContext(ctx, "ip", "link", "delete", nodesBridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w: %s", nodesBridge, err, out))
		}
	}
	if results, err := filepath.Glob("/var/lib/cni/results/" + cniNetwork + "-*"); err == nil {
		for _, r := range results {
			_ = os.Remove(r)
		}
	}
	// kubelet links container logs into /var/log/containers whatever podLogsDir says.
	if links, err := filepath.Glob("/var/log/containers/*.log"); err == nil {
		for _, l := range links {
			if target, err := os.Readlink(l); err == nil && strings.HasPrefix(target, n.layout.dir+"/") {
				_ = os.Remove(l)
			}
		}
	}
	for _, f := range []string{"kubelet.sock", "kubelet_internal_checkpoint"} {
		_ = os.Remove(filepath.Join(hostDevicePlugins, f))
	}
	return errs
}

// ComponentStatus is one component's state as Status sees it.
type ComponentStatus struct {
	Name    string
	PID     int
	Ready   bool
	Detail  string
	LogFile string
}

// Status reports every component and, when the API server answers, the node's readiness.
func (n *Node) Status(ctx context.Context) []ComponentStatus {
	n.useRecordedBin()
	var out []ComponentStatus
	for _, c := range n.components() {
		out = append(out, componentStatus(ctx, c.name, n.layout, c))
	}
	for _, w := range n.Workers() {
		for _, c := range w.components() {
			out = append(out, componentStatus(ctx, w.name+"/"+c.name, w.back, c))
		}
	}
	names := []string{n.name}
	for _, w := range n.Workers() {
		names = append(names, w.name)
	}
	for _, name := range names {
		s := ComponentStatus{Name: "node/" + name, Detail: "unknown (API server down)"}
		if c, err := n.apiClient(); err == nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			if err := c.nodeReady(pctx, name); err != nil {
				s.Detail = err.Error()
			} else {
				s.Ready, s.Detail = true, "Ready"
			}
			cancel()
		}
		out = append(out, s)
	}
	return out
}

func componentStatus(ctx context.Context, name string, l layout, c component) ComponentStatus {
	s := ComponentStatus{Name: name, LogFile: l.logFile(c.name)}
	pid, err := proc.Find(l.pidFile(c.name))
	switch {
	case err != nil:
		s.Detail = err.Error()
	case pid == 0:
		s.Detail = "stopped"
	default:
		s.PID = pid
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := c.probe(pctx); err != nil {
			s.Detail = "running, not ready: " + err.Error()
		} else {
			s.Ready, s.Detail = true, "running, ready"
		}
		cancel()
	}
	return s
}
