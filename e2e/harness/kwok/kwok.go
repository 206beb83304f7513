// Package kwok builds and runs KWOK's controller (sigs.k8s.io/kwok, pinned at
// Version, built by build.sh in this directory into a machine-wide cache) against an
// API server: nodes matching a label selector turn Ready and keep their leases, pods
// bound to them turn Running, deleted ones go. No kubelet, no containers: the
// fleet-scale simulator's fake nodes.
package kwok

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nvinject/nvinject/e2e/internal/cachebuild"
	"github.com/nvinject/nvinject/e2e/internal/proc"
)

// Version is the KWOK release build.sh builds.
const Version = "v0.8.0"

//go:embed build.sh
var script []byte

//go:embed stages.yaml
var stages []byte

// Bin builds kwok if it is not cached and returns the directory holding it (minutes
// the first time, from the Go module proxy). An unreachable proxy wraps
// cachebuild.ErrUnavailable.
func Bin(ctx context.Context) (string, error) {
	bin, err := cachebuild.Run(ctx, script, "build kwok "+Version+" (e2e/harness/kwok/build.sh)", nil)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(bin, "kwok")); err != nil {
		return "", fmt.Errorf("e2e/harness/kwok/build.sh printed %q: %w", bin, err)
	}
	return bin, nil
}

// Config says where and how the controller runs.
type Config struct {
	// Bin is the directory holding kwok (Bin's answer).
	Bin string
	// Kubeconfig is an admin kubeconfig for the API server.
	Kubeconfig string
	// Dir holds the stages, the pid file and the log (kwok.log).
	Dir string
	// NodeSelector is the label selector of the nodes KWOK manages.
	NodeSelector string
	// Parallelism is how many node and pod stages KWOK plays at once, and
	// LeaseParallelism how many node leases it renews at once (KWOK's default for
	// both, 4, falls behind a thousand nodes); 0 keeps KWOK's.
	Parallelism, LeaseParallelism int
}

// Controller is a running kwok.
type Controller struct {
	pidFile, log string
	pid          int
}

// Start runs kwok with the simulator's stages (stages.yaml) until Stop.
func Start(cfg Config) (*Controller, error) {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the kwok dir: %w", err)
	}
	config := filepath.Join(cfg.Dir, "kwok.yaml")
	if err := os.WriteFile(config, configFile(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("write the kwok config: %w", err)
	}
	c := &Controller{pidFile: filepath.Join(cfg.Dir, "kwok.pid"), log: filepath.Join(cfg.Dir, "kwok.log")}
	if pid, _ := proc.Find(c.pidFile); pid != 0 {
		return nil, fmt.Errorf("kwok already runs from %s (pid %d): stop it first (kill %d)", cfg.Dir, pid, pid)
	}
	args := []string{"--kubeconfig=" + cfg.Kubeconfig, "--config=" + config,
		"--manage-nodes-with-label-selector=" + cfg.NodeSelector}
	bin := filepath.Join(cfg.Bin, "kwok")
	pid, err := proc.Start(proc.Spec{Name: "kwok", Path: bin, Args: args, LogFile: c.log, PidFile: c.pidFile})
	if err != nil {
		return nil, err
	}
	c.pid = pid
	return c, nil
}

// configFile is KWOK's configuration (its options, then the stages). The options
// are only in the file: kwok has no flags for them.
func configFile(cfg Config) []byte {
	opts := "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n" +
		// kubelet's lease: 40s, renewed every 10s.
		"  nodeLeaseDurationSeconds: 40\n"
	if p := cfg.Parallelism; p > 0 {
		opts += fmt.Sprintf("  podPlayStageParallelism: %d\n  nodePlayStageParallelism: %d\n", p, p)
	}
	if p := cfg.LeaseParallelism; p > 0 {
		opts += fmt.Sprintf("  nodeLeaseParallelism: %d\n", p)
	}
	return append([]byte(opts+"---\n"), stages...)
}

// PID is kwok's process id.
func (c *Controller) PID() int { return c.pid }

// LogFile is kwok's log.
func (c *Controller) LogFile() string { return c.log }

// Running reports whether kwok still runs.
func (c *Controller) Running() bool { return proc.Running(c.pid, "") }

// Stop ends kwok (SIGTERM, then SIGKILL after 10s).
func (c *Controller) Stop(ctx context.Context) error {
	return proc.Stop(ctx, c.pidFile, 10*time.Second)
}
