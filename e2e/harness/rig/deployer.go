package rig

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
)

// Deployer installs nvinject on one local node.
type Deployer struct {
	node   *kubelocal.Node
	kube   *Kube
	repo   string
	bin    string
	tools  string
	driver Driver
	log    *slog.Logger
}

// New returns a Deployer for a node that is Up.
func New(node *kubelocal.Node, opts ...Option) (*Deployer, error) {
	d := &Deployer{node: node, repo: ".", bin: EquipmentDir, driver: Driver{Layout: Simulated}, log: slog.Default()}
	for _, o := range opts {
		o(d)
	}
	for _, p := range []*string{&d.repo, &d.bin} {
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", *p, err)
		}
		*p = abs
	}
	if _, err := os.Stat(filepath.Join(d.repo, "deploy", "overlays", "local-sim")); err != nil {
		return nil, fmt.Errorf("repo root %s has no deploy/overlays/local-sim: pass the nvinject checkout (WithRepoRoot): %w", d.repo, err)
	}
	k, err := NewKube(node.Kubeconfig(), d.tools)
	if err != nil {
		return nil, err
	}
	d.kube = k
	return d, nil
}

// Driver is the driver root the host gets.
func (d *Deployer) Driver() Driver { return d.driver }

// Kube is the node's API access.
func (d *Deployer) Kube() *Kube { return d.kube }

// Node is the local node nvinject is deployed on.
func (d *Deployer) Node() *kubelocal.Node { return d.node }

// Bin is a program from the nvinject bin dir.
func (d *Deployer) Bin(program string) string { return filepath.Join(d.bin, program) }

// HostSMICommand is the simulated worker's own nvidia-smi (the example's
// `docker exec <worker> nvidia-smi`): nvidia-smi-sim over the driver root's
// facts, viewing every GPU of the host.
func (d *Deployer) HostSMICommand() []string {
	return []string{"env", "NVINJECT_SIM_FACTS=" + filepath.Join(DriverRoot, SimFacts),
		"NVINJECT_SIM_HOST_VIEW=1", d.Bin("nvidia-smi-sim")}
}

// HostGPU is one line of the host's nvidia-smi.
type HostGPU struct{ Index, UUID, Name, MIG string }

// HostGPUs lists the simulated host's GPUs as its nvidia-smi reports them.
func (d *Deployer) HostGPUs(ctx context.Context) ([]HostGPU, error) {
	argv := append(d.HostSMICommand(), "--query-gpu=index,uuid,name,mig.mode.current", "--format=csv,noheader")
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("host nvidia-smi (%s): %w: %s", strings.Join(argv, " "), err, out)
	}
	var gpus []HostGPU
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, ", ")
		if len(f) != 4 {
			return nil, fmt.Errorf("host nvidia-smi: unexpected line %q", line)
		}
		gpus = append(gpus, HostGPU{Index: f[0], UUID: f[1], Name: f[2], MIG: f[3]})
	}
	return gpus, nil
}
