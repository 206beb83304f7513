// Package podresources is nvinject's one client of kubelet's PodResources
// API (v1): which container holds which device-plugin devices and which
// DRA claim devices, as plain data, and what kubelet's device manager can
// allocate. nvinject-nri, the node-move watch of both kubelet plugins, the
// doctor and the local node's harness all read kubelet through it.
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
)

// Lister is the generated client's List (a gRPC connection, or a test's
// kubelet).
type Lister interface {
	List(ctx context.Context, in *podresv1.ListPodResourcesRequest, opts ...grpc.CallOption) (*podresv1.ListPodResourcesResponse, error)
}

// allocatabler is the generated client's GetAllocatableResources.
type allocatabler interface {
	GetAllocatableResources(ctx context.Context, in *podresv1.AllocatableResourcesRequest, opts ...grpc.CallOption) (*podresv1.AllocatableResourcesResponse, error)
}

// Client reads one kubelet's PodResources.
type Client struct {
	api     Lister
	conn    *grpc.ClientConn
	socket  string
	timeout time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithTimeout bounds each call (default 1 s: kubelet answers from memory).
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// Dial returns the client of the kubelet serving socket. The connection is
// made on first use: a missing socket is a failed call, not an error here.
// Close it when done.
func Dial(socket string, opts ...Option) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("PodResources client for %s: %w; check --pod-resources-socket", socket, err)
	}
	c := New(podresv1.NewPodResourcesListerClient(conn), opts...)
	c.conn, c.socket = conn, socket
	return c, nil
}

// New returns the client of api.
func New(api Lister, opts ...Option) *Client {
	c := &Client{api: api, timeout: time.Second}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Close ends a dialled client's connection.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// Socket is the socket a dialled client reads ("" for New's).
func (c *Client) Socket() string { return c.socket }

// Pod is one pod kubelet admitted, with the containers it assigned
// devices or claims to.
type Pod struct {
	Namespace, Name string
	// Containers are those with devices or claims; a container absent
	// here was assigned nothing.
	Containers []Container
}

// Container is what kubelet assigned one container.
type Container struct {
	Name    string
	Devices []Devices
	Claims  []Claim
}

// Devices are the device-plugin devices of one resource, IDs sorted.
type Devices struct {
	Resource string
	IDs      []string
}

// Claim is one ResourceClaim a container uses, with its devices.
type Claim struct {
	Namespace, Name string
	Devices         []ClaimDevice
}

// ClaimDevice is one allocated device of a claim.
type ClaimDevice struct {
	Driver, Pool, Device string
	CDIDevices           []string
}

// Container returns the named container (the zero Container when kubelet
// assigned it nothing).
func (p Pod) Container(name string) Container {
	for _, c := range p.Containers {
		if c.Name == name {
			return c
		}
	}
	return Container{}
}

// IDs are the device IDs of the resources serve accepts, sorted.
func (c Container) IDs(serve func(resource string) bool) []string {
	var out []string
	for _, d := range c.Devices {
		if serve(d.Resource) {
			out = append(out, d.IDs...)
		}
	}
	slices.Sort(out)
	return out
}

// ClaimsOf are the container's claims with their devices of driver only;
// claims with none are left out.
func (c Container) ClaimsOf(driver string) []Claim {
	var out []Claim
	for _, cl := range c.Claims {
		mine := Claim{Namespace: cl.Namespace, Name: cl.Name}
		for _, d := range cl.Devices {
			if d.Driver == driver {
				mine.Devices = append(mine.Devices, d)
			}
		}
		if len(mine.Devices) > 0 {
			out = append(out, mine)
		}
	}
	return out
}

func (c Claim) String() string { return "ResourceClaim " + c.Namespace + "/" + c.Name }

// CDIDevices are the CDI names of the claim's devices, sorted.
func (c Claim) CDIDevices() []string {
	var out []string
	for _, d := range c.Devices {
		out = append(out, d.CDIDevices...)
	}
	slices.Sort(out)
	return out
}

// List asks kubelet which containers hold what.
func (c *Client) List(ctx context.Context) ([]Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := c.api.List(ctx, &podresv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list kubelet's PodResources%s: %w; check --pod-resources-socket (kubelet's pod-resources/kubelet.sock, mounted into the pod) and that kubelet runs", c.at(), err)
	}
	out := make([]Pod, 0, len(res.GetPodResources()))
	for _, pr := range res.GetPodResources() {
		p := Pod{Namespace: pr.GetNamespace(), Name: pr.GetName()}
		for _, cr := range pr.GetContainers() {
			ctr := Container{Name: cr.GetName(), Devices: devices(cr.GetDevices()), Claims: claims(cr)}
			if len(ctr.Devices) > 0 || len(ctr.Claims) > 0 {
				p.Containers = append(p.Containers, ctr)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// Allocatable asks kubelet's device manager which device-plugin devices it
// can allocate now (node status lags behind it).
func (c *Client) Allocatable(ctx context.Context) ([]Devices, error) {
	a, ok := c.api.(allocatabler)
	if !ok {
		return nil, fmt.Errorf("this PodResources client%s cannot ask for allocatable resources", c.at())
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := a.GetAllocatableResources(ctx, &podresv1.AllocatableResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("ask kubelet's PodResources%s for allocatable resources: %w; check that kubelet runs", c.at(), err)
	}
	return devices(res.GetDevices()), nil
}

func (c *Client) at() string {
	if c.socket == "" {
		return ""
	}
	return " at " + c.socket
}

func devices(in []*podresv1.ContainerDevices) []Devices {
	var out []Devices
	for _, d := range in {
		if len(d.GetDeviceIds()) == 0 {
			continue
		}
		ids := slices.Clone(d.GetDeviceIds())
		slices.Sort(ids)
		out = append(out, Devices{Resource: d.GetResourceName(), IDs: ids})
	}
	slices.SortStableFunc(out, func(a, b Devices) int { return strings.Compare(a.Resource, b.Resource) })
	return out
}

func claims(cr *podresv1.ContainerResources) []Claim {
	var out []Claim
	for _, dr := range cr.GetDynamicResources() {
		cl := Claim{Namespace: dr.GetClaimNamespace(), Name: dr.GetClaimName()}
		for _, r := range dr.GetClaimResources() {
			d := ClaimDevice{Driver: r.GetDriverName(), Pool: r.GetPoolName(), Device: r.GetDeviceName()}
			for _, n := range r.GetCdiDevices() {
				d.CDIDevices = append(d.CDIDevices, n.GetName())
			}
			cl.Devices = append(cl.Devices, d)
		}
		if len(cl.Devices) > 0 {
			out = append(out, cl)
		}
	}
	return out
}
