// Package endpoint is the device plugin protocol's one piece nvinject-dra
// uses: an empty device-plugin endpoint for the extended resource its
// DeviceClass serves (nvidia.com/gpu), registered with kubelet by the
// registrar the device plugin uses too (gpunode/kubelet). It lists no
// device, so kubelet publishes the resource with capacity and allocatable 0
// (the scheduler then serves a pod's nvidia.com/gpu: 1 through DRA,
// KEP-5004) while kubelet's device manager keeps an endpoint for the name.
//
// Why: a node that ran the device plugin keeps the resource in the device
// manager's allocated devices; once the stopped plugin's endpoint expires
// (5 min), Kubernetes 1.37.2 fails every DRA extended-resource container
// there ("endpoint not found in cache for a registered resource",
// GetDeviceRunContainerOptions → callPreStartContainerIfNeeded, which does
// not skip DRA-backed resources as Allocate does). See dra/README.md.
package endpoint

import (
	"context"
	"log/slog"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/gpunode/kubelet"
	"github.com/nvinject/nvinject/shared/contract"
)

// Socket is the endpoint's file name in kubelet's device-plugins directory.
const Socket = "nvinject-dra.sock"

// Hold serves the empty endpoint for resource and keeps it registered with
// the kubelet whose device-plugin directory is kubeletDir, kubelet restarts
// included, until ctx ends.
func Hold(ctx context.Context, kubeletDir, resource string, log *slog.Logger) error {
	srv := newServer(resource)
	return kubelet.New(kubeletDir, Socket, resource, srv, kubelet.WithLogger(log), kubelet.WithStopService(srv.Stop)).Run(ctx)
}

// server is the empty DevicePlugin service.
type server struct {
	pluginapi.UnimplementedDevicePluginServer
	resource string
	stopped  chan struct{}
	once     sync.Once
}

func newServer(resource string) *server {
	return &server{resource: resource, stopped: make(chan struct{})}
}

// Stop ends the ListAndWatch streams (the Registrar calls it at shutdown).
func (s *server) Stop() { s.once.Do(func() { close(s.stopped) }) }

// GetDevicePluginOptions asks for no PreStartContainer call.
func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the empty list once and holds the stream open: kubelet
// treats a closed stream as the plugin gone.
func (s *server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{}}); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
	case <-s.stopped:
	}
	return nil
}

// GetPreferredAllocation has nothing to prefer.
func (s *server) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// Allocate cannot be asked for a listed device; a call means kubelet took a
// pod past the scheduler's DRA path.
func (s *server) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	var ids []string
	for _, c := range req.ContainerRequests {
		ids = append(ids, c.DevicesIds...)
	}
	return nil, status.Errorf(codes.FailedPrecondition,
		"%s has no device-plugin device (asked for %s): this node's GPUs are DRA devices of driver %s, which the scheduler allocates through DeviceClass %s; check the DeviceClass's extendedResourceName is %s and that no device plugin also runs on the node",
		s.resource, contract.List(ids), contract.DRADriver, contract.DRADriver, s.resource)
}

// PreStartContainer is never requested (GetDevicePluginOptions).
func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
