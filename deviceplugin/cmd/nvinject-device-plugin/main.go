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
	"log/slog"
	"os"
	"slices"
	"syscall"

	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/daemon"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/shared/cli"
)

const name = config.Name

func main() {
	if slices.Equal(os.Args[1:], []string{"--recover"}) {
		os.Exit(cli.Code(name, recoverPID1(os.Stdout), os.Stderr))
	}
	os.Exit(gpunode.Main(name, os.Args[1:], os.Getenv, config.Load, func(ctx context.Context, cfg config.Config, log *slog.Logger, node ...gpunode.Option) error {
		return daemon.New(cfg, log, daemon.WithNode(node...)).Run(ctx)
	}))
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
