// scale-sim is the fleet-scale simulator: it brings a real control plane up in
// its own run dir and ports (no kubelet, no containerd), gives --nodes fake GPU nodes
// (KWOK) of 8 simulated GPUs each, half on the device plugin's path and half on
// DRA's, publishes the DRA nodes' ResourceSlices with nvinject-dra's own code, fills
// 90 % of the GPUs with pods asking for nvidia.com/gpu: 1, churns 5 pods a second for
// a minute, runs pods of a CEL claim template (GPUs of >= 80Gi), then a quiet minute
// and a health storm (1 % of the GPUs flapping at 1 Hz through the daemons' health
// limiter), prints what it measured and tears everything down.
//
//	scale-sim [--nodes 1000] [--run-dir /tmp/scale-sim] [--json] [--fill 0.9] [--churn 1m]
//	               [--storm 1m] [--storm-fraction 0.01]
//
// It needs the pinned control-plane programs (NVINJECT_TOOLS_BIN, `make tools`) and
// builds KWOK (e2e/harness/kwok) into the machine-wide cache if it is not there.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/e2e/bench/scale"
	"github.com/nvinject/nvinject/e2e/harness/kwok"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/logging"
)

const name = "scale-sim"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.Code(name, err, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var logFlags logging.Flags
	c := cli.New(name, "[flags]", cli.WithOutput(stdout, stderr))
	fs := c.Flags()
	nodes := fs.Int("nodes", 1000, "fake GPU nodes, half device plugin, half DRA")
	runDir := fs.String("run-dir", scale.DefaultRunDir, "the control plane's state and logs (logs stay after the run)")
	toolsBin := fs.String("tools-bin", "", "directory with the pinned control-plane programs (`make tools`)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	fill := fs.Float64("fill", 0.9, "fraction of the GPUs the fill asks for, in (0, 1]")
	churnFor := fs.Duration("churn", time.Minute, "how long to replace 5 pods a second after the fill")
	stormFor := fs.Duration("storm", time.Minute, "how long GPUs flap after a quiet phase of the same length (0: no storm)")
	stormFraction := fs.Float64("storm-fraction", 0.01, "fraction of the GPUs that flap in the storm (0: no storm)")
	probeRate := fs.Float64("probe-rate", scale.DefaultProbeRate, "pods a second a path timed in the quiet and storm phases")
	kubeletSync := fs.Duration("kubelet-sync", scale.DefaultKubeletSync, "device-plugin nodes' kubelet node status sync (nodeStatusUpdateFrequency)")
	timeout := fs.Duration("timeout", 40*time.Minute, "give up after this long")
	logFlags.Register(fs, logging.Text)
	c.Env("tools-bin", "NVINJECT_TOOLS_BIN")
	if err := c.Parse(args, getenv); err != nil {
		return err
	}
	switch {
	case len(c.Args()) > 0:
		return cli.Usagef("unexpected arguments %q", c.Args())
	case *nodes < 2:
		return cli.Usagef("--nodes %d: give at least 2 (one per path)", *nodes)
	case *fill <= 0 || *fill > 1:
		return cli.Usagef("--fill %g: give a fraction in (0, 1]", *fill)
	case *stormFraction < 0 || *stormFraction > 1 || *stormFor < 0:
		return cli.Usagef("--storm %s --storm-fraction %g: give a duration >= 0 and a fraction in [0, 1]", *stormFor, *stormFraction)
	case *probeRate <= 0 || *kubeletSync <= 0:
		return cli.Usagef("--probe-rate %g --kubelet-sync %s: give both above 0", *probeRate, *kubeletSync)
	case *toolsBin == "":
		return cli.Usagef("--tools-bin (NVINJECT_TOOLS_BIN) is unset: run `make tools` and give the bin dir it prints (make scale does both)")
	}
	if *stormFraction == 0 {
		*stormFor = 0
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	kwokBin, err := kwok.Bin(ctx)
	if err != nil {
		return err
	}
	rep, err := scale.Run(ctx, scale.Config{Nodes: *nodes, RunDir: *runDir, ToolsBin: *toolsBin, KwokBin: kwokBin, Fill: *fill, ChurnFor: *churnFor,
		Storm: *stormFor, StormFraction: *stormFraction, ProbeRate: *probeRate, KubeletSync: *kubeletSync, Log: log})
	if err != nil {
		return fmt.Errorf("%w; the components' logs are in %s/logs", err, *runDir)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.Write(stdout)
	return nil
}
