// Command nvinject-device-plugin publishes the node's selected NVIDIA GPUs
// to kubelet as nvidia.com/gpu and answers Allocate with CDI device names.
//
// Signals: SIGTERM/SIGINT stop it (streams closed, socket removed); SIGHUP
// is the operator's recovery action: every GPU NVML vouches for loses its
// Xid and loss marks. Without SIGHUP an Xid-unhealthy GPU recovers after
// --health-quiet-period without new Xids. `nvinject-device-plugin
// --recover` sends that SIGHUP to the plugin running as PID 1 of its
// container, for images without a kill command:
//
//	kubectl -n nvidia-device-plugin exec ds/single-gpu-device-plugin -- nvinject-device-plugin --recover
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/daemon"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/logging"
)

const name = "nvinject-device-plugin"

func main() {
	if slices.Equal(os.Args[1:], []string{"--recover"}) {
		os.Exit(cli.Code(name, recoverPID1(os.Stdout), os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, hup)
	signal.Stop(hup)
	stop()
	os.Exit(cli.Code(name, err, os.Stderr))
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
	if err := daemon.New(cfg, log, daemon.WithNode(gpunode.WithRecoverSignal(hup))).Run(ctx); err != nil {
		log.Error(name+" failed", logging.Err(err))
		return err
	}
	return nil
}

// recoverPID1 asks the plugin in this container (PID 1) to recover every GPU.
func recoverPID1(out io.Writer) error {
	comm, err := os.ReadFile("/proc/1/comm")
	if err != nil {
		return fmt.Errorf("read /proc/1/comm: %w; run --recover inside the plugin's container (kubectl exec)", err)
	}
	if got := string(comm); got != name[:15]+"\n" && got != name+"\n" {
		return fmt.Errorf("PID 1 is %q, not %s: run --recover inside the plugin's container (kubectl -n nvidia-device-plugin exec ds/single-gpu-device-plugin -- %s --recover)", got[:len(got)-1], name, name)
	}
	if err := syscall.Kill(1, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signal the plugin (PID 1): %w", err)
	}
	_, err = fmt.Fprintln(out, "sent SIGHUP to the plugin (PID 1): every GPU NVML vouches for is Healthy again; see its log")
	return err
}
