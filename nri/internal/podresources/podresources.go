// Package podresources asks kubelet which devices it assigned to a
// container, over the PodResources API on kubelet's unix socket.
package podresources

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
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

// DeviceIDs returns the IDs of resource assigned to container ctr of pod
// namespace/pod. Get is used where kubelet serves it, else List.
func (c *Client) DeviceIDs(ctx context.Context, namespace, pod, ctr, resource string) ([]string, error) {
	pr, err := c.get(ctx, namespace, pod)
	if err != nil {
		return nil, err
	}
	ids := []string{}
	for _, cr := range pr.GetContainers() {
		if cr.GetName() != ctr {
			continue
		}
		for _, d := range cr.GetDevices() {
			if d.GetResourceName() == resource {
				ids = append(ids, d.GetDeviceIds()...)
			}
		}
	}
	slices.Sort(ids)
	return ids, nil
}

func (c *Client) get(ctx context.Context, namespace, pod string) (*podresv1.PodResources, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := c.api.Get(ctx, &podresv1.GetPodResourcesRequest{PodName: pod, PodNamespace: namespace})
	var pr *podresv1.PodResources
	switch {
	case err == nil:
		pr = res.GetPodResources()
	case status.Code(err) == codes.Unimplemented:
		pr, err = c.list(ctx, namespace, pod)
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("ask kubelet (%s) for pod %s/%s's devices: %w; check --pod-resources-socket and that kubelet runs", c.socket, namespace, pod, err)
	}
	if pr == nil {
		return nil, fmt.Errorf("kubelet (%s) knows no pod %s/%s", c.socket, namespace, pod)
	}
	return pr, nil
}

func (c *Client) list(ctx context.Context, namespace, pod string) (*podresv1.PodResources, error) {
	res, err := c.api.List(ctx, &podresv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list kubelet's (%s) pod resources: %w; check --pod-resources-socket and that kubelet runs", c.socket, err)
	}
	for _, pr := range res.GetPodResources() {
		if pr.GetNamespace() == namespace && pr.GetName() == pod {
			return pr, nil
		}
	}
	return nil, nil
}
