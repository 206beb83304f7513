// Package plugin implements the kubelet v1beta1 DevicePlugin service over
// the resource table, the health tracker and the allocate responder.
package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
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
	table  *devices.Table
	health Health
	// reported is the health the device list shows kubelet; Allocate
	// refuses by health, which is never late.
	reported Health
	withheld Withheld
	resp     *allocate.Responder
	metrics  *metrics.Metrics
	log      *slog.Logger

	// oneReplica refuses a container asking for more than one device of a
	// shared resource (failRequestsGreaterThanOne).
	oneReplica bool

	stopOnce sync.Once
	stopped  chan struct{}
}

// Option configures a Server.
type Option func(*Server)

// WithWithheld publishes the GPUs w withholds Unhealthy (default: none).
func WithWithheld(w Withheld) Option { return func(s *Server) { s.withheld = w } }

// WithReported lists the devices with h's health (gpunode's Reported: at
// most one change per --health-update-interval) instead of the tracker's.
func WithReported(h Health) Option { return func(s *Server) { s.reported = h } }

// WithOneReplicaPerContainer refuses a container that asks for more than
// one replica of a shared resource (time-slicing's
// failRequestsGreaterThanOne): two replicas of one GPU are not two GPUs.
func WithOneReplicaPerContainer() Option { return func(s *Server) { s.oneReplica = true } }

// New returns the service.
func New(table *devices.Table, health Health, resp *allocate.Responder, m *metrics.Metrics, log *slog.Logger, opts ...Option) *Server {
	s := &Server{table: table, health: health, withheld: none{}, resp: resp, metrics: m, log: log, stopped: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	if s.reported == nil {
		s.reported = health
	}
	return s
}

// none withholds nothing (--pod-resources-socket empty).
type none struct{}

func (none) Withheld(string) (string, bool)       { return "", false }
func (none) Subscribe() (<-chan struct{}, func()) { return nil, func() {} }

// heldWhy says why e must not be handed out because another path holds
// it: the unit itself, or for a MIG device its parent.
func (s *Server) heldWhy(e devices.Entry) (string, bool) {
	if why, held := s.withheld.Withheld(e.UUID); held {
		return why, true
	}
	if e.UUID != e.Device.UUID {
		return s.withheld.Withheld(e.Device.UUID)
	}
	return "", false
}

// listed says whether the list offers the device: its GPU (a MIG
// device's parent) reported Healthy, and neither withheld.
func (s *Server) listed(e devices.Entry) bool {
	_, held := s.heldWhy(e)
	return !held && s.reported.Healthy(e.Device.UUID)
}

// Stop ends every ListAndWatch stream, so a graceful gRPC stop completes.
func (s *Server) Stop() { s.stopOnce.Do(func() { close(s.stopped) }) }

// GetDevicePluginOptions announces GetPreferredAllocation.
func (s *Server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// List returns the published devices with their reported health; a
// withheld GPU is Unhealthy too.
func (s *Server) List() []*pluginapi.Device {
	entries := s.table.Entries()
	out := make([]*pluginapi.Device, len(entries))
	for i, e := range entries {
		d := &pluginapi.Device{ID: e.ID, Health: pluginapi.Unhealthy}
		if s.listed(e) {
			d.Health = pluginapi.Healthy
		}
		if e.Device.NUMANode >= 0 {
			d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(e.Device.NUMANode)}}}
		}
		out[i] = d
	}
	return out
}

// ListAndWatch sends the full list at once and after every reported
// health or withheld change until the stream or the server ends.
// Notifications are coalesced, so a slow stream only skips intermediate
// states.
func (s *Server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	changed, cancel := s.reported.Subscribe()
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
		if s.oneReplica && len(ids) > 1 {
			s.metrics.Allocations.WithLabelValues("refused").Inc()
			return nil, status.Errorf(codes.InvalidArgument, "allocate: %d replicas of a shared GPU asked for one container, and failRequestsGreaterThanOne is set: replicas of one GPU are not more GPUs; ask for 1", len(ids))
		}
		names := make([]string, 0, len(ids))
		var unknown, held, unhealthy []string
		for _, id := range ids {
			e, ok := s.table.Lookup(id)
			why, withheld := "", false
			if ok {
				why, withheld = s.heldWhy(e)
			}
			switch {
			case !ok:
				unknown = append(unknown, id)
			case withheld:
				held = append(held, id+" ("+why+")")
			case !s.health.Healthy(e.Device.UUID):
				unhealthy = append(unhealthy, id)
			case !slices.Contains(names, e.CDIName):
				// Two replicas of one GPU are one device in the container.
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
