// Package plugin implements the kubelet v1beta1 DevicePlugin service over
// the resource table, the health tracker and the allocate responder.
package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/deviceplugin/internal/allocate"
	"github.com/nvinject/nvinject/deviceplugin/internal/devices"
	"github.com/nvinject/nvinject/deviceplugin/internal/metrics"
	"github.com/nvinject/nvinject/shared/logging"
)

// Health is what the service needs from the health tracker.
type Health interface {
	Healthy(uuid string) bool
	Subscribe() (<-chan struct{}, func())
}

// Withheld is what the service needs to know of GPUs another path holds
// (a DRA claim): published Unhealthy and refused while withheld.
type Withheld interface {
	Withheld(uuid string) (why string, withheld bool)
	Subscribe() (<-chan struct{}, func())
}

// Server is the DevicePlugin service.
type Server struct {
	pluginapi.UnimplementedDevicePluginServer
	table    *devices.Table
	health   Health
	withheld Withheld
	resp     *allocate.Responder
	metrics  *metrics.Metrics
	log      *slog.Logger

	stopOnce sync.Once
	stopped  chan struct{}
}

// Option configures a Server.
type Option func(*Server)

// WithWithheld publishes the GPUs w withholds Unhealthy (default: none).
func WithWithheld(w Withheld) Option { return func(s *Server) { s.withheld = w } }

// New returns the service.
func New(table *devices.Table, health Health, resp *allocate.Responder, m *metrics.Metrics, log *slog.Logger, opts ...Option) *Server {
	s := &Server{table: table, health: health, withheld: none{}, resp: resp, metrics: m, log: log, stopped: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	return s
}

// none withholds nothing (--pod-resources-socket empty).
type none struct{}

func (none) Withheld(string) (string, bool)       { return "", false }
func (none) Subscribe() (<-chan struct{}, func()) { return nil, func() {} }

// available says whether the GPU may be handed out: Healthy and not withheld.
func (s *Server) available(uuid string) bool {
	_, held := s.withheld.Withheld(uuid)
	return !held && s.health.Healthy(uuid)
}

// Stop ends every ListAndWatch stream, so a graceful gRPC stop completes.
func (s *Server) Stop() { s.stopOnce.Do(func() { close(s.stopped) }) }

// GetDevicePluginOptions announces GetPreferredAllocation.
func (s *Server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// List returns the published devices with their current health; a
// withheld GPU is Unhealthy too.
func (s *Server) List() []*pluginapi.Device {
	entries := s.table.Entries()
	out := make([]*pluginapi.Device, len(entries))
	for i, e := range entries {
		d := &pluginapi.Device{ID: e.ID, Health: pluginapi.Unhealthy}
		if s.available(e.Device.UUID) {
			d.Health = pluginapi.Healthy
		}
		if e.Device.NUMANode >= 0 {
			d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(e.Device.NUMANode)}}}
		}
		out[i] = d
	}
	return out
}

// ListAndWatch sends the full list at once and after every health or
// withheld change until the stream or the server ends. Notifications are
// coalesced, so a slow stream only skips intermediate states.
func (s *Server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	changed, cancel := s.health.Subscribe()
	defer cancel()
	heldChanged, cancelHeld := s.withheld.Subscribe()
	defer cancelHeld()
	s.metrics.ActiveStreams.Inc()
	defer s.metrics.ActiveStreams.Dec()
	var last []*pluginapi.Device
	for {
		list := s.List()
		if !sameList(last, list) {
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: list}); err != nil {
				return fmt.Errorf("send device list to kubelet: %w", err)
			}
			last = list
		}
		select {
		case <-changed:
		case <-heldChanged:
		case <-stream.Context().Done():
			return nil
		case <-s.stopped:
			return nil
		}
	}
}

func sameList(a, b []*pluginapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Health != b[i].Health {
			return false
		}
	}
	return true
}

// GetPreferredAllocation answers from the topology cached at start; it
// never fails the request.
func (s *Server) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.GetContainerRequests() {
		ids := s.table.Preferred(c.GetAvailableDeviceIDs(), c.GetMustIncludeDeviceIDs(), int(c.GetAllocationSize()))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate returns the CDI names of the requested GPUs. Unknown, withheld
// and Unhealthy IDs are refused, naming them.
func (s *Server) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		ids := c.GetDevicesIds()
		names := make([]string, 0, len(ids))
		var unknown, held, unhealthy []string
		for _, id := range ids {
			e, ok := s.table.Lookup(id)
			why, withheld := "", false
			if ok {
				why, withheld = s.withheld.Withheld(e.Device.UUID)
			}
			switch {
			case !ok:
				unknown = append(unknown, id)
			case withheld:
				held = append(held, id+" ("+why+")")
			case !s.health.Healthy(e.Device.UUID):
				unhealthy = append(unhealthy, id)
			default:
				names = append(names, e.CDIName)
			}
		}
		if err := refusal(ids, unknown, held, unhealthy); err != nil {
			s.metrics.Allocations.WithLabelValues("refused").Inc()
			s.log.Warn("refused allocation", "ids", ids, logging.Err(err))
			return nil, err
		}
		cr, err := s.resp.Container(ids, names)
		if err != nil {
			s.metrics.Allocations.WithLabelValues("refused").Inc()
			return nil, status.Error(codes.Internal, err.Error())
		}
		s.metrics.Allocations.WithLabelValues("ok").Inc()
		s.log.Info("allocated", "ids", ids, "cdi_devices", names)
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

func refusal(ids, unknown, held, unhealthy []string) error {
	switch {
	case len(ids) == 0:
		return status.Error(codes.InvalidArgument, "allocate: a container request names no devices")
	case len(unknown) > 0:
		return status.Errorf(codes.InvalidArgument, "allocate: unknown device IDs %s: this plugin does not publish them (kubelet state from another plugin or configuration?)", strings.Join(unknown, ", "))
	case len(held) > 0:
		return status.Errorf(codes.FailedPrecondition, "allocate: devices %s are withheld: a DRA claim's pod holds them, or kubelet's PodResources cannot be read; delete that pod, or fix the plugin's --pod-resources-socket", strings.Join(held, "; "))
	case len(unhealthy) > 0:
		return status.Errorf(codes.FailedPrecondition, "allocate: devices %s are Unhealthy; see the plugin's log for the Xid or loss and its recovery policy", strings.Join(unhealthy, ", "))
	}
	return nil
}

// PreStartContainer is not requested by this plugin.
func (s *Server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
