// Package gpunode is what both kubelet plugins do to the GPU node before
// and beside their own protocol.
package gpunode

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nvinject/nvinject/gpunode/nodeconfig"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// OpenFunc opens NVML: backend.Open, or a test's simulated node.
type OpenFunc func(nvml string, o backend.Options) (*backend.Backend, error)

// OpenNVML opens the backend cfg names with the one retry policy: under
// --on-nvml-error=exit a failure is returned; under wait it is logged,
// passed to notReady and retried every retry until NVML opens or ctx ends
// (then nil, nil).
func OpenNVML(ctx context.Context, cfg nodeconfig.Config, open OpenFunc, retry time.Duration, log *slog.Logger, notReady func(why string)) (*backend.Backend, error) {
	for {
		b, err := open(cfg.NVML, backend.Options{DriverRoot: cfg.DriverRoot})
		if err == nil {
			return b, nil
		}
		err = fmt.Errorf("cannot open NVML (--nvml=%s): %w", cfg.NVML, err)
		if cfg.OnNVMLError == nodeconfig.OnNVMLErrorExit {
			return nil, err
		}
		notReady(err.Error())
		log.Error("NVML unavailable; no GPUs published, retrying (set --on-nvml-error=exit to fail instead)", "error", err, "retry_in", retry)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(retry):
		}
	}
}
