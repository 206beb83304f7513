package scenarios

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/e2e/harness/rig"
)

// runDir is short on purpose: unix socket paths stay under ~100 bytes.
const runDir = "/tmp/nvinject-scn"

// suite is the shared node; nil with skipWhy set when the tests cannot run.
var (
	suite   *rig.Deployer
	dep     rig.Deployment
	driver  rig.Driver
	skipWhy string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	start := time.Now()
	defer func() { fmt.Printf("scenarios: suite total %s\n", time.Since(start).Round(time.Millisecond)) }()
	pre := rig.SuitePreflight(runDir, "make e2e")
	tools, repo, bin := pre.Tools, pre.Repo, pre.Bin
	skipWhy = pre.Skip
	if skipWhy != "" {
		fmt.Println("scenarios: skipping:", skipWhy)
		return m.Run()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// DRIVER_LAYOUT: flat (default), debian, or simulated.
	t0 := time.Now()
	drv, err := rig.ChooseDriver(ctx, os.Getenv("DRIVER_LAYOUT"), os.Stderr)
	if err != nil {
		fmt.Println("scenarios: driver root:", err)
		return 1
	}
	driver = drv
	fmt.Printf("scenarios: %s (ready in %s)\n", drv, time.Since(t0).Round(time.Millisecond))
	node := kubelocal.New(kubelocal.WithRunDir(runDir), kubelocal.WithToolsBin(tools), kubelocal.WithLogger(log),
		kubelocal.WithContainerdDropIn(filepath.Join(repo, "deploy", "containerd", "nvinject.toml")),
		kubelocal.WithPauseBinary(filepath.Join(bin, "pause")), kubelocal.WithTimeout(2*time.Minute))
	defer func() {
		if err := errors.Join(node.Down(context.Background()), rig.RemoveDriverRoot()); err != nil {
			fmt.Println("scenarios: tear down:", err)
		}
	}()
	t0 = time.Now()
	if err := node.Up(ctx); err != nil {
		fmt.Println("scenarios: node up:", err)
		return 1
	}
	fmt.Printf("scenarios: node up in %s\n", time.Since(t0).Round(time.Millisecond))
	d, err := rig.New(node, rig.WithRepoRoot(repo), rig.WithBinDir(bin), rig.WithToolsBin(tools), rig.WithLogger(log), rig.WithDriver(driver))
	if err == nil {
		t0 = time.Now()
		err = d.ImportImages(ctx)
		fmt.Printf("scenarios: images imported in %s\n", time.Since(t0).Round(time.Millisecond))
	}
	if err == nil {
		t0 = time.Now()
		dep, err = d.Deploy(ctx, rig.GPUs{NVML: rig.DefaultNVML})
	}
	if err != nil {
		fmt.Println("scenarios: deploy nvinject:", err)
		return 1
	}
	fmt.Printf("scenarios: nvinject deployed in %s, selected GPU %s\n", time.Since(t0).Round(time.Millisecond), dep.UUID)
	suite = d
	return m.Run()
}

// need returns the shared node or skips t.
func need(t testing.TB) *rig.Deployer {
	t.Helper()
	if suite == nil {
		t.Skip(skipWhy)
	}
	return suite
}
