package nodemove

import (
	"context"
	"log/slog"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/logging"
)

// NodeAPI is what ReleaseIfMovedAway needs of the API server.
type NodeAPI interface {
	// NodeLabels returns the node's labels.
	NodeLabels(ctx context.Context, node string) (map[string]string, error)
	// DeleteSlices deletes the node's ResourceSlices of nvinject's DRA
	// driver; a slice already gone is no error.
	DeleteSlices(ctx context.Context, node string) error
}

// releaseTimeout bounds the API calls at shutdown.
const releaseTimeout = 5 * time.Second

// ReleaseIfMovedAway deletes node's ResourceSlices when nvinject-dra stops
// because the node no longer selects it: ownerLabel no longer says dra.
// kubelet would wipe them only 30 s after the plugin is gone; a claim
// allocated from them meanwhile leaves its pod stuck in ContainerCreating,
// since no driver prepares it. A restart on a DRA node keeps them, so
// claims can still be allocated while it restarts; so does an empty
// ownerLabel (nvinject-dra on every node). Failures are logged: kubelet
// still removes the slices.
func ReleaseIfMovedAway(api NodeAPI, node, ownerLabel string, log *slog.Logger) {
	if ownerLabel == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	labels, err := api.NodeLabels(ctx, node)
	if err != nil {
		log.Warn("cannot read the Node to tell a move from a restart; leaving the ResourceSlices to kubelet", "node", node, logging.Err(err))
		return
	}
	if labels[ownerLabel] == contract.DRAModeDRA {
		return
	}
	if err := api.DeleteSlices(ctx, node); err != nil {
		log.Warn("cannot delete the ResourceSlices of a node moved away from DRA; kubelet removes them within 30 s", "node", node, logging.Err(err))
		return
	}
	log.Info("node moved away from DRA: ResourceSlices deleted", "node", node, "label", ownerLabel+"="+labels[ownerLabel])
}
