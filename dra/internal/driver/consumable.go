package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/claimconfig"
	"github.com/nvinject/nvinject/shared/contract"
)

// shareDevice makes pd, the allocation r of share device dev, enforced:
// the claim's MPS daemon runs over dev's GPU with the share's memory as
// its pinned memory limit and its compute as its active thread percentage.
// A share that cannot be enforced is refused.
func (d *Driver) shareDevice(pd *checkpoint.Device, dev Device, r resourceapi.DeviceRequestAllocationResult, cfg *claimconfig.GpuConfig) error {
	if r.ShareID == nil || *r.ShareID == "" {
		return fmt.Errorf("%s was allocated without a share ID; the API server and scheduler need the DRAConsumableCapacity feature gate (beta, on by default from Kubernetes 1.36)", dev.Describe())
	}
	if cfg.Strategy() != "" {
		return fmt.Errorf("%s: request %s names a sharing strategy (%s); a share is shared by its capacity alone: remove the GpuConfig's sharing", dev.Describe(), contract.Quote(r.Request), cfg.Strategy())
	}
	if d.mps == nil {
		return fmt.Errorf("%s cannot be enforced: this nvinject-dra runs no MPS daemons (the driver root has no %s, or --mps-dir is empty); ask for a whole GPU (DeviceClass %s) instead", dev.Describe(), "nvidia-cuda-mps-control", contract.DRADriver)
	}
	mem := consumed(r, contract.DRACapacityMemory, ShareMemoryDefault)
	pct := consumed(r, contract.DRACapacityComputePercent, ShareComputeDefault)
	if mem < 1<<20 || pct < 1 || pct > 100 {
		return fmt.Errorf("%s: the share's capacity (memory %d bytes, computePercent %d) cannot be enforced by MPS, which needs at least 1Mi and 1..100 percent; change the request's capacity", dev.Describe(), mem, pct)
	}
	pd.Sharing = string(claimconfig.MPS)
	pd.MPS = &checkpoint.MPSLimits{ActiveThreadPercentage: int(pct), PinnedMemoryMiB: uint64(mem) >> 20}
	pd.ShareID = string(*r.ShareID)
	return nil
}

// ShareReadyTimeout bounds how long prepare waits for a share's MPS daemon
// to listen with its limits set.
const ShareReadyTimeout = 10 * time.Second

// waitShare returns once the MPS daemon of claim c, if c holds a GPU share,
// listens with the share's limits set: a container started before would
// reach a daemon without them. A daemon not ready in ShareReadyTimeout
// refuses the claim (kubelet retries the prepare).
func (d *Driver) waitShare(ctx context.Context, c checkpoint.Claim) error {
	if claimAnnotations(c)[contract.GPUShareAnnotation] == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, ShareReadyTimeout)
	defer cancel()
	if err := d.mps.Wait(ctx, c.UID); err != nil {
		return fmt.Errorf("the share's MPS daemon did not set its limits: %w; check nvinject-dra's log for the daemon's output", err)
	}
	return nil
}

// consumed is how much of capacity name allocation r consumes: the
// scheduler records it; def (the request policy's default) if it did not.
func consumed(r resourceapi.DeviceRequestAllocationResult, name resourceapi.QualifiedName, def int64) int64 {
	q, ok := r.ConsumedCapacity[name]
	if !ok {
		return def
	}
	return q.Value()
}

// oneShare refuses a claim that holds more than one share, or a share and
// other devices shared by MPS: the claim's one MPS daemon enforces one
// share's limits.
func oneShare(c checkpoint.Claim) error {
	shares, mps := 0, 0
	for _, dev := range c.Devices {
		if dev.ShareID != "" && !dev.AdminAccess {
			shares++
		}
		if dev.MPS != nil {
			mps++
		}
	}
	if shares > 0 && mps > 1 {
		return errors.New("it holds more than one GPU share, or a share and GPUs shared by MPS; one claim's MPS daemon enforces one share: ask for the memory and compute in one request, or use one claim per share")
	}
	return nil
}

// shareID is a checkpointed share ID as kubelet takes it back.
func shareID(id string) *types.UID {
	if id == "" {
		return nil
	}
	u := types.UID(id)
	return &u
}

// claimAnnotations are the per-claim CDI device's annotations beyond the
// claim's UID and GPUs: the share ID of a claim holding a GPU share, which
// tells nvinject-nri that other shares' pods may hold the GPU beside it,
// and admin access, which lets the claim's pods watch GPUs others hold.
func claimAnnotations(c checkpoint.Claim) map[string]string {
	out := map[string]string{}
	for _, dev := range c.Devices {
		if dev.ShareID != "" && !dev.AdminAccess {
			out[contract.GPUShareAnnotation] = dev.ShareID
		}
		if dev.AdminAccess {
			out[contract.AdminAccessAnnotation] = "true"
		}
	}
	return out
}
