package simnode

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// WaitKubeletAllocatable waits until kubelet's own device manager (PodResources
// GetAllocatableResources) offers device ID id as Resource. Node status lags behind it,
// and a GPU pod admitted before it fails with UnexpectedAdmissionError.
func (d *Deployer) WaitKubeletAllocatable(ctx context.Context, id string, timeout time.Duration) error {
	sock := filepath.Join(d.node.PodResourcesDir(), "kubelet.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to kubelet PodResources %s: %w", sock, err)
	}
	defer conn.Close()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return Poll(ctx, 100*time.Millisecond, func(ctx context.Context) error {
		resp, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
		if err != nil {
			return fmt.Errorf("kubelet PodResources %s: %w", sock, err)
		}
		for _, dev := range resp.GetDevices() {
			if dev.GetResourceName() == Resource && slices.Contains(dev.GetDeviceIds(), id) {
				return nil
			}
		}
		return fmt.Errorf("kubelet does not offer %s as %s yet", id, Resource)
	})
}
