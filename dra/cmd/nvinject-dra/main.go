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
	"log/slog"
	"os"

	"github.com/nvinject/nvinject/dra/internal/config"
	"github.com/nvinject/nvinject/dra/internal/daemon"
	"github.com/nvinject/nvinject/gpunode"
)

func main() {
	os.Exit(gpunode.Main(config.Name, os.Args[1:], os.Getenv, config.Load, func(ctx context.Context, cfg config.Config, log *slog.Logger, node ...gpunode.Option) error {
		return daemon.New(cfg, log, daemon.WithNode(node...)).Run(ctx)
	}))
}
