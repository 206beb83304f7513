package kubelocal

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
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

// PID is the process id of a running component (0 when it is not running), for
// measuring it (its RSS, say).
func (n *Node) PID(component string) (int, error) {
	return proc.Find(n.layout.pidFile(component))
}

// EtcdURL is the node's etcd client URL (plain HTTP on loopback; /metrics too).
func (n *Node) EtcdURL() string { return "http://127.0.0.1:" + strconv.Itoa(n.ports.EtcdClient) }

// SchedulerURL is kube-scheduler's secure port (https://127.0.0.1:port, self-signed;
// /metrics answers the admin client certificate).
func (n *Node) SchedulerURL() string {
	return "https://127.0.0.1:" + strconv.Itoa(n.ports.Scheduler)
}

// SetHostDevices makes the host's device nodes the node created exactly
// devs: missing ones are created (mknod; no kernel module needs to be
// loaded), ones the node created earlier and devs no longer names are
// removed, and nodes the host had before are used and left alone. Down
// removes what the node created.
func (n *Node) SetHostDevices(devs []hostclean.CharDevice) error {
	return hostclean.EnsureDevices(n.layout.hostDevices(), devs)
}

// HostDevicesRecord is the file listing the host device nodes the node
// created; equipment that creates more at runtime (sim-mig's
// --record) adds them there, so Down removes them too.
func (n *Node) HostDevicesRecord() string { return n.layout.hostDevices() }
