package nvmlinv

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/nvinject/nvinject/shared/gpu"
)

// CheckHealth asks NVML whether the GPU with uuid answers and what its
// memory health is: pending retired pages, row remapping, and the volatile
// uncorrected ECC count. A query the GPU does not support (NOT_SUPPORTED)
// counts as healthy; any other failure means the GPU does not answer.
func (i *Inventory) CheckHealth(ctx context.Context, uuid string) (gpu.DeviceHealth, error) {
	var h gpu.DeviceHealth
	if err := ctx.Err(); err != nil {
		return h, err
	}
	d, ret := i.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return h, nvmlErr("open GPU "+uuid, ret)
	}
	if got, ret := d.GetUUID(); ret != nvml.SUCCESS || got != uuid {
		return h, fmt.Errorf("NVML: GPU %s does not answer (read UUID: %s)", uuid, nvml.ErrorString(ret))
	}
	pending, ret := d.GetRetiredPagesPendingStatus()
	switch ret {
	case nvml.SUCCESS:
		h.RetiredPagesPending = pending == nvml.FEATURE_ENABLED
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return h, nvmlErr("read GPU "+uuid+"'s pending retired pages", ret)
	}
	_, _, remapPending, remapFailed, ret := d.GetRemappedRows()
	switch ret {
	case nvml.SUCCESS:
		h.RowRemapPending, h.RowRemapFailure = remapPending, remapFailed
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return h, nvmlErr("read GPU "+uuid+"'s remapped rows", ret)
	}
	ecc, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	switch ret {
	case nvml.SUCCESS:
		h.ECCSupported, h.VolatileUncorrectedECC = true, ecc
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return h, nvmlErr("read GPU "+uuid+"'s volatile uncorrected ECC errors", ret)
	}
	return h, nil
}
