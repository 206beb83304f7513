package gpunode

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/logging"
)

// Settings is a kubelet plugin's configuration as Main needs it; both
// embed nodeconfig.Config, which has Logger.
type Settings interface {
	Attrs() []any
	Warnings() []string
	Logger(stderr io.Writer) (*slog.Logger, error)
}

// Loader reads a plugin's configuration (the plugin's config.Load). It
// answers --help and --version itself and returns cli.ErrHelp or
// cli.ErrVersion then.
type Loader[C Settings] func(args []string, getenv func(string) string, stdout, stderr io.Writer) (C, error)

// Daemon runs a plugin's daemon for cfg until ctx ends; node are the
// options for its GPU node (the recovery signal).
type Daemon[C Settings] func(ctx context.Context, cfg C, log *slog.Logger, node ...Option) error

// Main is a kubelet plugin process and returns its exit code: SIGTERM and
// SIGINT end it, SIGHUP is the operator's recovery of every GPU NVML
// vouches for. It loads the configuration from args and getenv, logs it,
// and runs the daemon; a failure is logged and printed (shared/cli).
func Main[C Settings](name string, args []string, getenv func(string) string, load Loader[C], run Daemon[C]) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return cli.Code(name, start(ctx, name, args, getenv, os.Stdout, os.Stderr, load, run, WithRecoverSignal(hup)), os.Stderr)
}

func start[C Settings](ctx context.Context, name string, args []string, getenv func(string) string, stdout, stderr io.Writer, load Loader[C], run Daemon[C], node ...Option) error {
	cfg, err := load(args, getenv, stdout, stderr)
	if err != nil {
		return err
	}
	log, err := cfg.Logger(stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	log.Info("effective configuration", cfg.Attrs()...)
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}
	if err := run(ctx, cfg, log, node...); err != nil {
		log.Error(name+" failed", logging.Err(err))
		return err
	}
	return nil
}
