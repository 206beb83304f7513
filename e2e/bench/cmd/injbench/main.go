// Command injbench measures nvinject's GPU injection overhead on a
// containerd of its own: N GPU containers through containerd's native CDI
// (a) and N through nvinject-nri (b), interleaved, and prints medians, p90s
// and the ratio b/a as a table and a JSON line. See package injbench for
// what (a) and (b) are and why.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/e2e/bench/injbench"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/logging"
)

const name = "injbench"

func main() { os.Exit(cli.Code(name, run(os.Args[1:]), os.Stderr)) }

func run(args []string) error {
	self, _ := os.Executable()
	c := cli.New(name, "[flags]", cli.WithAbout("Measures GPU container create+start through containerd's native CDI (a) against nvinject-nri (b) on a containerd of its own, interleaved (root)."))
	flag := c.Flags()
	var logFlags logging.Flags
	var (
		n        = flag.Int("n", 20, "measured GPU containers per path")
		warmup   = flag.Int("warmup", 1, "unmeasured GPU containers per path before measuring")
		toolsBin = flag.String("tools-bin", os.Getenv("NVINJECT_TOOLS_BIN"), "dir with containerd, containerd-shim-runc-v2, ctr and runc (e2e/harness/tools/build.sh --print-bin)")
		bin      = flag.String("bin", filepath.Dir(self), "dir with nvinject-cdi, nvidia-smi-sim, nvinject-nri and pause (make build: bin/)")
		busybox  = flag.String("busybox", "/bin/busybox", "busybox binary for the workload image")
		runDir   = flag.String("run-dir", "/tmp/nvinject-injbench", "containerd state, sockets and logs (keep it short: unix socket paths)")
		timeout  = flag.Duration("timeout", time.Minute, "limit for each CRI call and each daemon's start")
		verbose  = flag.Bool("v", false, "log progress at debug level")
	)
	logFlags.Register(flag, logging.Text)
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if len(c.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q", c.Args())
	}
	if *toolsBin == "" {
		return cli.Usagef("no tools dir: pass --tools-bin $(e2e/harness/tools/build.sh --print-bin) or set NVINJECT_TOOLS_BIN")
	}
	if *verbose {
		logFlags.Level = "debug"
	}
	log, err := logFlags.Logger(os.Stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	res, err := injbench.New(
		injbench.WithContainers(*n), injbench.WithWarmup(*warmup),
		injbench.WithToolsBin(*toolsBin), injbench.WithNvinjectBin(*bin), injbench.WithBusybox(*busybox),
		injbench.WithRunDir(*runDir), injbench.WithTimeout(*timeout), injbench.WithLogger(log),
	).Run(ctx)
	if err != nil {
		return fmt.Errorf("%w (logs: %s/logs)", err, *runDir)
	}
	rep := res.Summarize()
	if err := rep.WriteTable(os.Stdout); err != nil {
		return err
	}
	line, err := rep.JSON()
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	return nil
}
