package plugin

import (
	"context"
	"errors"
	"time"

	"github.com/nvinject/nvinject/nri/internal/verify"
)

// InventoryRefresh reads the node's GPUs and MIG devices again.
type InventoryRefresh func(context.Context) (*verify.Inventory, error)

// WithInventoryRefresh reads the inventory again when a check finds a GPU
// or MIG device it does not know, or knows elsewhere: the MIG layout
// changed since it was read (the kubelet plugins republish a new layout
// without a restart, and so must the check). At most once per
// refreshEvery; the check is then made once more against the new
// inventory, and still refuses what the node does not have.
func WithInventoryRefresh(f InventoryRefresh) Option { return func(h *Handler) { h.refresh = f } }

// refreshEvery bounds the re-reads a stream of stale specs can cause.
const refreshEvery = time.Second

// inv is the inventory as last read; nil if unknown.
func (h *Handler) inv() *verify.Inventory {
	h.invMu.Lock()
	defer h.invMu.Unlock()
	return h.inventory
}

// verifyInput checks in against the inventory, reading the inventory again
// once if the check says it is stale.
func (h *Handler) verifyInput(ctx context.Context, in verify.Input) error {
	in.Inventory = h.inv()
	err := verify.Check(in)
	var m *verify.MismatchError
	if err == nil || h.refresh == nil || !errors.As(err, &m) || m.Reason != verify.ReasonStaleSpec {
		return err
	}
	if !h.refreshInventory(ctx, in.Inventory) {
		return err
	}
	in.Inventory = h.inv()
	return verify.Check(in)
}

// refreshInventory reads the inventory again unless another request did
// since seen was current, or one did within refreshEvery; it says whether
// the inventory may have changed.
func (h *Handler) refreshInventory(ctx context.Context, seen *verify.Inventory) bool {
	h.invMu.Lock()
	defer h.invMu.Unlock()
	if h.inventory != seen {
		return true
	}
	if time.Since(h.refreshed) < refreshEvery {
		return false
	}
	h.refreshed = time.Now()
	inv, err := h.refresh(ctx)
	if err != nil {
		h.log.Warn("reading the GPU inventory again failed; checking against the one read before", "error", err)
		return false
	}
	h.inventory = inv
	h.log.Info("GPU inventory read again (the MIG layout changed)", "gpus", len(inv.GPUs), "mig_devices", len(inv.MIG))
	return true
}
