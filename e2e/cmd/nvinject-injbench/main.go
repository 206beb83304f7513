// Command nvinject-injbench measures nvinject's GPU injection overhead on a
// containerd of its own: N GPU containers through containerd's native CDI
// (a) and N through nvinject-nri (b), interleaved, and prints medians, p90s
// and the ratio b/a as a table and a JSON line. See package injbench for
// what (a) and (b) are and why.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/e2e/injbench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "nvinject-injbench:", err)
		os.Exit(1)
	}
}

func run() error {
	self, _ := os.Executable()
	var (
		n        = flag.Int("n", 20, "measured GPU containers per path")
		warmup   = flag.Int("warmup", 1, "unmeasured GPU containers per path before measuring")
		toolsBin = flag.String("tools-bin", os.Getenv("NVINJECT_TOOLS_BIN"), "dir with containerd, containerd-shim-runc-v2, ctr and runc (e2e/tools/build.sh --print-bin)")
		bin      = flag.String("bin", filepath.Dir(self), "dir with nvinject-cdi, nvidia-smi-sim, nvinject-nri and pause (make build: bin/)")
		busybox  = flag.String("busybox", "/bin/busybox", "busybox binary for the workload image")
		runDir   = flag.String("run-dir", "/tmp/nvinject-injbench", "containerd state, sockets and logs (keep it short: unix socket paths)")
		timeout  = flag.Duration("timeout", time.Minute, "limit for each CRI call and each daemon's start")
		verbose  = flag.Bool("v", false, "log progress at debug level")
	)
	flag.Parse()
	if *toolsBin == "" {
		return fmt.Errorf("no tools dir: pass -tools-bin $(e2e/tools/build.sh --print-bin) or set NVINJECT_TOOLS_BIN")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
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
