package simnode

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// CheckNoOtherNode refuses to start while a kubelet outside runDir runs on
// this host: kubelet's /var/lib/kubelet/device-plugins is hard-coded, so two
// nodes would see each other's device plugins.
func CheckNoOtherNode(runDir string) error {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return fmt.Errorf("list processes: %w", err)
	}
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		argv := bytes.Split(cmdline, []byte{0})
		if filepath.Base(string(argv[0])) != "kubelet" || bytes.Contains(cmdline, []byte(runDir+"/")) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		return fmt.Errorf("another kubelet runs on this host (pid %d: %s); it shares /var/lib/kubelet/device-plugins: stop that node first",
			pid, bytes.Join(argv, []byte(" ")))
	}
	return nil
}

// CDISpecDirs are the CDI dirs the node's containerd reads: its own, then the
// drop-in's (deploy/containerd/nvinject.toml).
func (d *Deployer) CDISpecDirs() []string {
	return []string{d.node.CDIDir(), "/etc/cdi", "/var/run/cdi"}
}
