package rig

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/nvinject/nvinject/shared/podresources"
)

// WaitKubeletAllocatable waits until kubelet's own device manager (PodResources
// GetAllocatableResources) offers device ID id as Resource. Node status lags behind it,
// and a GPU pod admitted before it fails with UnexpectedAdmissionError.
func (d *Deployer) WaitKubeletAllocatable(ctx context.Context, id string, timeout time.Duration) error {
	c, err := podresources.Dial(filepath.Join(d.node.PodResourcesDir(), "kubelet.sock"))
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		devs, err := c.Allocatable(ctx)
		if err != nil {
			return err
		}
		for _, dev := range devs {
			if dev.Resource == Resource && slices.Contains(dev.IDs, id) {
				return nil
			}
		}
		return fmt.Errorf("kubelet does not offer %s as %s yet", id, Resource)
	})
}
