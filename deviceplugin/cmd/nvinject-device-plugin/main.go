// Command nvinject-device-plugin publishes the node's selected NVIDIA GPUs
// to kubelet as nvidia.com/gpu and answers Allocate with CDI device names.
//
// Signals: SIGTERM/SIGINT stop it (streams closed, socket removed); SIGHUP
// is the operator's recovery action: every GPU's Xid and loss marks are
// cleared. Without SIGHUP an Xid-unhealthy GPU recovers after
// --health-quiet-period without new Xids.
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/daemon"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/logging"
)

const name = "nvinject-device-plugin"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	recoverAll := make(chan struct{})
	// The SIGHUP forwarder is owned by main: it ends with ctx, and main
	// waits for it before exiting.
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-hup:
				select {
				case recoverAll <- struct{}{}:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	})
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, recoverAll)
	stop()
	signal.Stop(hup)
	wg.Wait()
	os.Exit(cli.Code(name, err, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, recoverAll <-chan struct{}) error {
	cfg, err := config.Load(args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	log, err := logging.New(stderr, cfg.LogFormat, cfg.LogLevel)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	log.Info("effective configuration", cfg.Attrs()...)
	if err := daemon.New(cfg, log, daemon.WithRecoverAll(recoverAll)).Run(ctx); err != nil {
		log.Error(name+" failed", logging.Err(err))
		return err
	}
	return nil
}
