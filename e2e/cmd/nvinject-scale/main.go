// nvinject-scale is the fleet-scale simulator: it brings a real control plane up in
// its own run dir and ports (no kubelet, no containerd), gives --nodes fake GPU nodes
// (KWOK) of 8 simulated GPUs each, half on the device plugin's path and half on
// DRA's, publishes the DRA nodes' ResourceSlices with nvinject-dra's own code, fills
// 90 % of the GPUs with pods asking for nvidia.com/gpu: 1, churns 5 pods a second for
// a minute, runs pods of a CEL claim template (GPUs of >= 80Gi), then a quiet minute
// and a health storm (1 % of the GPUs flapping at 1 Hz through the daemons' health
// limiter), prints what it measured and tears everything down.
//
//	nvinject-scale [--nodes 1000] [--run-dir /tmp/nvinject-scale] [--json] [--fill 0.9] [--churn 1m]
//	               [--storm 1m] [--storm-fraction 0.01]
//
// It needs the pinned control-plane programs (NVINJECT_TOOLS_BIN, `make tools`) and
// builds KWOK (e2e/kwok) into the machine-wide cache if it is not there.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/e2e/kwok"
	"github.com/nvinject/nvinject/e2e/scale"
)

func main() {
	nodes := flag.Int("nodes", 1000, "fake GPU nodes, half device plugin, half DRA")
	runDir := flag.String("run-dir", scale.DefaultRunDir, "the control plane's state and logs (logs stay after the run)")
	asJSON := flag.Bool("json", false, "print the report as JSON")
	fill := flag.Float64("fill", 0.9, "fraction of the GPUs the fill asks for, in (0, 1]")
	churnFor := flag.Duration("churn", time.Minute, "how long to replace 5 pods a second after the fill")
	stormFor := flag.Duration("storm", time.Minute, "how long GPUs flap after a quiet phase of the same length (0: no storm)")
	stormFraction := flag.Float64("storm-fraction", 0.01, "fraction of the GPUs that flap in the storm (0: no storm)")
	timeout := flag.Duration("timeout", 40*time.Minute, "give up after this long")
	flag.Parse()
	if *stormFraction == 0 {
		*stormFor = 0
	}
	if err := run(*nodes, *runDir, *asJSON, *fill, *churnFor, *stormFor, *stormFraction, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "nvinject-scale:", err)
		os.Exit(1)
	}
}

func run(nodes int, runDir string, asJSON bool, fill float64, churnFor, stormFor time.Duration, stormFraction float64, timeout time.Duration) error {
	if nodes < 2 {
		return fmt.Errorf("--nodes %d: give at least 2 (one per path)", nodes)
	}
	if fill <= 0 || fill > 1 {
		return fmt.Errorf("--fill %g: give a fraction in (0, 1]", fill)
	}
	if stormFraction < 0 || stormFraction > 1 || stormFor < 0 {
		return fmt.Errorf("--storm %s --storm-fraction %g: give a duration >= 0 and a fraction in [0, 1]", stormFor, stormFraction)
	}
	tools := os.Getenv("NVINJECT_TOOLS_BIN")
	if tools == "" {
		return fmt.Errorf("NVINJECT_TOOLS_BIN is unset: run `make tools` and set it to the bin dir it prints (make scale does both)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	kwokBin, err := kwok.Bin(ctx)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	rep, err := scale.Run(ctx, scale.Config{Nodes: nodes, RunDir: runDir, ToolsBin: tools, KwokBin: kwokBin, Fill: fill, ChurnFor: churnFor,
		Storm: stormFor, StormFraction: stormFraction, Log: log})
	if err != nil {
		return fmt.Errorf("%w; the components' logs are in %s/logs", err, runDir)
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.Write(os.Stdout)
	return nil
}
