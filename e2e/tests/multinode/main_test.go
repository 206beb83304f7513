// Package fleet runs nvinject on several real local nodes under one control plane
// (kubelocal.WithWorkers): both paths side by side, GPUs chosen by model, nodes moved,
// upgraded and broken one at a time. FLEET_NODES=3 (make e2e-fleet) adds a third node.
package multinode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nvinject/nvinject/e2e/harness/driverroot"
	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/e2e/harness/rig"
)

// runDir differs from the scenarios' so a leftover of either is never the other's.
const runDir = "/tmp/nvinject-flt"

var (
	suite   *rig.Deployer
	nodes   []rig.FleetNode
	skipWhy string
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	start := time.Now()
	defer func() { fmt.Printf("fleet: suite total %s\n", time.Since(start).Round(time.Millisecond)) }()
	pre := rig.SuitePreflight(runDir, "make e2e-fleet")
	tools, repo, bin := pre.Tools, pre.Repo, pre.Bin
	skipWhy = pre.Skip
	if skipWhy != "" {
		fmt.Println("fleet: skipping:", skipWhy)
		return m.Run()
	}
	count := 2
	if os.Getenv("FLEET_NODES") == "3" {
		count = 3
	}
	nodes = rig.DemoFleet(kubelocal.DefaultNodeName, count)
	var workers []string
	for _, n := range nodes[1:] {
		workers = append(workers, n.Name)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	drv, err := rig.ChooseDriver(ctx, os.Getenv("DRIVER_LAYOUT"), os.Stderr)
	if err != nil {
		fmt.Println("fleet: driver root:", err)
		return 1
	}
	fmt.Printf("fleet: %s\n", drv)
	if len(nodes) > 2 && drv.Real() {
		// The third node runs the driver the upgrade goes to.
		if nodes[2].Driver, err = rig.ChooseDriverVersion(ctx, driverroot.DriverVersion550, drv.Layout, os.Stderr); err != nil {
			fmt.Println("fleet: driver root:", err)
			return 1
		}
		fmt.Printf("fleet: %s: %s\n", nodes[2].Name, nodes[2].Driver)
	}
	node := kubelocal.New(kubelocal.WithRunDir(runDir), kubelocal.WithToolsBin(tools), kubelocal.WithLogger(log),
		kubelocal.WithContainerdDropIn(filepath.Join(repo, "deploy", "containerd", "nvinject.toml")),
		kubelocal.WithPauseBinary(filepath.Join(bin, "pause")), kubelocal.WithTimeout(2*time.Minute),
		kubelocal.WithWorkers(workers...), kubelocal.WithNodeLocalDirs(rig.FleetNodeLocalDirs()...))
	defer func() {
		if err := errors.Join(node.Down(context.Background()), rig.RemoveDriverRoot()); err != nil {
			fmt.Println("fleet: tear down:", err)
		}
	}()
	t0 := time.Now()
	if err := node.Up(ctx); err != nil {
		fmt.Println("fleet: nodes up:", err)
		return 1
	}
	fmt.Printf("fleet: %d nodes up in %s\n", len(nodes), time.Since(t0).Round(time.Millisecond))
	d, err := rig.New(node, rig.WithRepoRoot(repo), rig.WithBinDir(bin), rig.WithToolsBin(tools),
		rig.WithLogger(log), rig.WithDriver(drv))
	if err == nil {
		t0 = time.Now()
		err = d.ImportImages(ctx)
		fmt.Printf("fleet: images imported into %d nodes in %s\n", len(nodes), time.Since(t0).Round(time.Millisecond))
	}
	if err == nil {
		t0 = time.Now()
		_, err = d.DeployFleet(ctx, nodes, 4*time.Minute)
	}
	if err != nil {
		fmt.Println("fleet: deploy nvinject:", err)
		return 1
	}
	fmt.Printf("fleet: nvinject deployed, every node publishing, in %s\n", time.Since(t0).Round(time.Millisecond))
	suite = d
	return m.Run()
}

func need(t testing.TB) *rig.Deployer {
	t.Helper()
	if suite == nil {
		t.Skip(skipWhy)
	}
	return suite
}
