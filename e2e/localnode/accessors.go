package localnode

import (
	"context"
	"fmt"
	"time"

	"github.com/nvinject/nvinject/e2e/internal/proc"
)

// PodResourcesDir holds kubelet's PodResources socket (kubelet.sock).
func (n *Node) PodResourcesDir() string { return n.layout.path("kubelet", "pod-resources") }

// ContainerdConfig is the node's containerd config file (its imports hold the drop-in).
func (n *Node) ContainerdConfig() string { return n.layout.containerdConfig() }

// Restart stops one running component (such as kubelet or containerd) and starts it
// again with the same arguments, returning once it is ready. Containers survive: their
// shims are separate processes.
func (n *Node) Restart(ctx context.Context, component string) error {
	for _, c := range n.components() {
		if c.name != component {
			continue
		}
		if err := proc.Stop(ctx, n.layout.pidFile(c.name), 15*time.Second); err != nil {
			return fmt.Errorf("restart %s: stop: %w", c.name, err)
		}
		return n.startAndWait(ctx, c)
	}
	return fmt.Errorf("restart %q: the node has no such component (containerd, etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet)", component)
}
