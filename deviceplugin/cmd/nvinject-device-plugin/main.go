// Command nvinject-device-plugin publishes the node's selected NVIDIA GPUs
// to kubelet as nvidia.com/gpu and answers Allocate with CDI device names.
//
// Signals: SIGTERM/SIGINT stop it (streams closed, socket removed); SIGHUP
// is the operator's recovery action: every GPU NVML vouches for loses its
// Xid and loss marks. Without SIGHUP an Xid-unhealthy GPU recovers after
// --health-quiet-period without new Xids.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/daemon"
	"github.com/nvinject/nvinject/shared/logging"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, hup); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "nvinject-device-plugin:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, hup <-chan os.Signal) error {
	cfg, err := config.Load(args, getenv, stderr)
	if err != nil {
		return err
	}
	log, err := logging.New(stderr, cfg.LogFormat, cfg.LogLevel)
	if err != nil {
		return err
	}
	log.Info("effective configuration", cfg.Attrs()...)
	return daemon.New(cfg, log, daemon.WithRecoverSignal(hup)).Run(ctx)
}
