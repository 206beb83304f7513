// Command nvinject-dra is nvinject's DRA kubelet plugin (driver
// gpu.nvinject.io): it publishes the node's selected NVIDIA GPUs in a
// ResourceSlice, prepares claims with the GPUs' names in the node's one CDI
// spec, and reports GPU health to kubelet and as device taints.
//
// Signals: SIGTERM/SIGINT stop it (sockets removed, the ResourceSlice
// stays for the next instance); SIGHUP clears every GPU's Xid and loss
// marks. Without SIGHUP an Xid-unhealthy GPU recovers after
// --health-quiet-period without new Xids.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/nvinject/nvinject/dra/internal/config"
	"github.com/nvinject/nvinject/dra/internal/daemon"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/shared/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, hup)
	signal.Stop(hup)
	stop()
	os.Exit(cli.Code(config.Name, err, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, hup <-chan os.Signal) error {
	cfg, err := config.Load(args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	log, err := cfg.Log.Logger(stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	log.Info("effective configuration", cfg.Attrs()...)
	return daemon.New(cfg, log, daemon.WithNode(gpunode.WithRecoverSignal(hup))).Run(ctx)
}
