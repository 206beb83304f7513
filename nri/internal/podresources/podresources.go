// Package podresources asks kubelet which devices it assigned to the
// containers of its pods, over the PodResources API on kubelet's unix socket.
package podresources

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// Client queries one kubelet.
type Client struct {
	socket  string
	conn    *grpc.ClientConn
	api     podresv1.PodResourcesListerClient
	timeout time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds each query (default 1s; NRI gives a whole
// CreateContainer 2s by default).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// New prepares a client for the socket; it connects lazily, so a kubelet
// that starts later is found.
func New(socket string, opts ...Option) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("PodResources client for %s: %w; check --pod-resources-socket", socket, err)
	}
	c := &Client{socket: socket, conn: conn, api: podresv1.NewPodResourcesListerClient(conn), timeout: time.Second}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Close releases the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Pod is one pod kubelet lists and what it assigned its containers.
type Pod struct {
	Namespace, Name string
	// Containers are those with device IDs or claims; a container absent
	// here was assigned nothing.
	Containers []Container
}

// Container is what kubelet assigned one container: the device-plugin IDs
// of one resource and the MIG resources of its domain (sorted), and the
// DRA claims of one driver.
type Container struct {
	Name      string
	DeviceIDs []string
	Claims    []Claim
}

// Container returns what kubelet assigned the pod's container name (the
// zero Container for nothing).
func (p Pod) Container(name string) Container {
	for _, c := range p.Containers {
		if c.Name == name {
			return c
		}
	}
	return Container{}
}

// serves reports whether kubelet's resource name is resource or one of
// the MIG resources of its domain (nvidia.com/mig-1g.10gb for
// nvidia.com/gpu, as --mig-strategy=mixed publishes them).
func serves(resource, name string) bool {
	return name == resource || strings.HasPrefix(name, contract.MIGResourceName(resource, ""))
}

// List returns every pod kubelet lists, in one List call: Get would answer
// for one pod, List also for the pods that may hold the same GPU. Kubelets
// with KubeletPodResourcesListUseActivePods (on by default since 1.34)
// list only pods that have not terminated.
func (c *Client) List(ctx context.Context, resource, driver string) ([]Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := c.api.List(ctx, &podresv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list kubelet's (%s) pod resources: %w; check --pod-resources-socket and that kubelet runs", c.socket, err)
	}
	out := make([]Pod, 0, len(res.GetPodResources()))
	for _, pr := range res.GetPodResources() {
		p := Pod{Namespace: pr.GetNamespace(), Name: pr.GetName()}
		for _, cr := range pr.GetContainers() {
			ctr := Container{Name: cr.GetName(), Claims: claims(cr, driver)}
			for _, d := range cr.GetDevices() {
				if serves(resource, d.GetResourceName()) {
					ctr.DeviceIDs = append(ctr.DeviceIDs, d.GetDeviceIds()...)
				}
			}
			if len(ctr.DeviceIDs) > 0 || len(ctr.Claims) > 0 {
				slices.Sort(ctr.DeviceIDs)
				p.Containers = append(p.Containers, ctr)
			}
		}
		out = append(out, p)
	}
	return out, nil
}
