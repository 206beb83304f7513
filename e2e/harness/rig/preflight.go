package rig

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

// Suite is what a local-node test suite's TestMain needs to start: the pinned tools,
// nvinject's programs and the repository; Skip says why it cannot run here.
type Suite struct {
	Tools, Bin, Repo string
	Skip             string
}

// SuitePreflight reads NVINJECT_TOOLS_BIN and NVINJECT_BIN (default repo/_out/equipment, repo
// being two levels up) and checks root and that no other node runs from another run
// dir than runDir; make names the target that sets everything.
func SuitePreflight(runDir, make string) Suite {
	s := Suite{Tools: os.Getenv("NVINJECT_TOOLS_BIN"), Bin: os.Getenv("NVINJECT_BIN")}
	s.Repo, _ = filepath.Abs("../../..")
	if s.Bin == "" {
		s.Bin = filepath.Join(s.Repo, EquipmentDir)
	}
	switch {
	case s.Tools == "":
		s.Skip = "NVINJECT_TOOLS_BIN is unset: run `" + make + "` (or `make tools` and export its bin dir)"
	case os.Geteuid() != 0:
		s.Skip = "the local nodes need root (namespaces, mounts, cgroups, runc)"
	default:
		if _, err := os.Stat(filepath.Join(s.Bin, "nvinject-device-plugin")); err != nil {
			s.Skip = fmt.Sprintf("nvinject programs missing in %s: run `make equipment` (or set NVINJECT_BIN): %v", s.Bin, err)
		} else if err := CheckNoOtherNode(runDir); err != nil {
			s.Skip = err.Error()
		}
	}
	return s
}
