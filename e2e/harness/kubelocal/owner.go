package kubelocal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/e2e/internal/proc"
)

// ownerFile names the run dir of the node that owns the host-wide pieces: kubelet's fixed
// /var/lib/kubelet/device-plugins, the kubepods cgroups, the CNI bridge. Only one local node
// can use them at a time, and only their owner may remove them.
const ownerFile = "/run/nvinject-localnode.owner"

// claimHost records this node as the owner, refusing while another live node holds it.
func (n *Node) claimHost() error {
	if other := currentOwner(); other != "" && other != n.layout.dir && nodeAlive(other) {
		return fmt.Errorf("another local node runs from %s and owns the host-wide kubelet, cgroup and CNI state: run `kubelocal down -run-dir %s` first", other, other)
	}
	if pid, cmdline := n.foreignKubelet(); pid != 0 {
		return fmt.Errorf("another kubelet (pid %d: %s) owns the host-wide device-plugin dir and kubepods cgroups: stop it first", pid, cmdline)
	}
	if err := os.WriteFile(ownerFile, []byte(n.layout.dir+"\n"), 0o644); err != nil {
		return fmt.Errorf("record host owner: %w", err)
	}
	return nil
}

// ownsHost reports whether this node may clean host-wide state: it is the recorded owner,
// or the recorded owner is gone.
func (n *Node) ownsHost() bool {
	if other := currentOwner(); other != "" && other != n.layout.dir && nodeAlive(other) {
		return false
	}
	pid, _ := n.foreignKubelet()
	return pid == 0
}

// foreignKubelet finds a running kubelet that is not this node's, e.g. one started by an
// older harness that recorded no owner.
func (n *Node) foreignKubelet() (int, string) {
	for _, pid := range hostclean.Processes("kubelet", "--root-dir=") {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if filepath.Base(args[0]) != "kubelet" || strings.Contains(string(cmdline), "--root-dir="+n.layout.kubeletRoot()) {
			continue
		}
		return pid, strings.Join(args, " ")
	}
	return 0, ""
}

func (n *Node) releaseHost() {
	if currentOwner() == n.layout.dir {
		_ = os.Remove(ownerFile)
	}
}

func currentOwner() string {
	data, err := os.ReadFile(ownerFile)
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// nodeAlive reports whether any component of the node in runDir still runs.
func nodeAlive(runDir string) bool {
	pids, _ := filepath.Glob(filepath.Join(runDir, "pids", "*.pid"))
	for _, p := range pids {
		if pid, _ := proc.Find(p); pid != 0 {
			return true
		}
	}
	return false
}
