// Package driver is nvinject's DRA driver logic behind the kubeletplugin
// helper: the ResourceSlice devices (one per selected GPU with MIG off, one
// per MIG device of a GPU with MIG on, counters per GPU (KEP-4815) where a
// GPU has MIG on, taints while Unhealthy), NodePrepareResources/NodeUnprepareResources answered
// with the shared CDI spec's device names and checkpointed, and the
// KEP-4680 health stream. It owns no sockets and no API client: the daemon
// wires it to kubeletplugin.
package driver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvinject/nvinject/dra/internal/checkpoint"
	"github.com/nvinject/nvinject/dra/internal/claimspec"
	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/gpunode/mps"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// Health is the GPUs' health as the tracker keeps it; *health.Tracker
// satisfies it.
type Health interface {
	States() []health.State
	Subscribe() (<-chan struct{}, func())
}

// Metrics counts what the driver does (NopMetrics is the default).
type Metrics interface {
	Prepared(result string)
	Unprepared(result string)
	SetPreparedClaims(n int)
	HealthStream(delta int)
	BackgroundError()
}

// NopMetrics records nothing.
type NopMetrics struct{}

func (NopMetrics) Prepared(string)       {}
func (NopMetrics) Unprepared(string)     {}
func (NopMetrics) SetPreparedClaims(int) {}
func (NopMetrics) HealthStream(int)      {}
func (NopMetrics) BackgroundError()      {}

// Device is one published device: a whole GPU, or a MIG device.
type Device struct {
	// Device is the physical GPU (a MIG device's parent): health and the
	// held taints follow its UUID.
	gpu.Device
	// MIG is the MIG device; nil for a whole GPU.
	MIG *gpu.MIGDevice
	// Share marks the GPU's share device (WithShares): many claims each
	// get a part of its memory and compute, enforced by an MPS daemon.
	Share bool
	// Slot marks a placement where a MIG device is made on demand
	// (WithMIGOnDemand); its MIG device exists only while a claim holds it.
	Slot *gpu.MIGSlot
	// Name is the device's name in the ResourceSlice (gpu-<index>, or
	// contract.DRAMIGDeviceName for a MIG device).
	Name string
	// CDIName is the device in the shared CDI spec (nvidia.com/gpu=<uuid>,
	// the MIG device's own UUID for a MIG device).
	CDIName string
}

// ID is the device's own UUID: the MIG device's, else the GPU's.
func (d Device) ID() string {
	if d.MIG != nil {
		return d.MIG.UUID
	}
	return d.UUID
}

// Describe names the device for messages.
func (d Device) Describe() string {
	if d.Share {
		return fmt.Sprintf("share device %s of GPU %s", d.Name, d.UUID)
	}
	if d.Slot != nil {
		return fmt.Sprintf("MIG placement %s (%s at slice %d on GPU %s)", d.Name, d.Slot.Profile, d.Slot.Placement.Start, d.UUID)
	}
	if d.MIG != nil {
		return fmt.Sprintf("MIG device %s (%s on GPU %s)", d.Name, d.MIG.UUID, d.UUID)
	}
	return fmt.Sprintf("GPU %s (%s)", d.Name, d.UUID)
}

// DeviceName is a GPU's name in the ResourceSlice.
func DeviceName(d gpu.Device) string { return contract.DRADeviceName(d.Index) }

// Driver answers the kubelet plugin calls for one node.
type Driver struct {
	driver  string
	pool    string
	node    gpu.Node
	devices []Device
	byName  map[string]Device
	// counters are the GPUs' counter sets, nil unless a GPU has MIG on.
	counters []resourceapi.CounterSet
	health   Health
	// reported is the health the ResourceSlice's taints follow; prepare
	// and the health stream follow health, which is never late.
	reported    Health
	state       *checkpoint.Store
	log         *slog.Logger
	metrics     Metrics
	resend      time.Duration
	healthLease time.Duration
	fatal       func(error)
	lookup      ClaimLookup
	// claimSpecs holds shared claims' own CDI specs; nil refuses sharing.
	claimSpecs *claimspec.Dir
	// mps runs the MPS daemons of claims shared by MPS; nil refuses MPS.
	mps MPSDaemons
	// shares publishes a share device beside each whole GPU.
	shares bool
	// maker makes MIG devices on demand; nil publishes MIG devices that
	// exist only.
	maker   MIGMaker
	cdiName func(uuid string) string
	parents map[string]gpu.Device

	// unhealthySince keeps each Unhealthy GPU's first Unhealthy time, so a
	// republished taint keeps its timeAdded.
	mu             sync.Mutex
	unhealthySince map[string]time.Time
	// held are the GPUs device-plugin pods still hold (SetHeld), or every
	// GPU while that is unknown (SetHeldUnknown), with the taint's value.
	held      map[string]heldTaint
	republish chan struct{}
}

// heldTaint is one GPU's held taint: its value and when it was set.
type heldTaint struct {
	value string
	since time.Time
}

// Option configures a Driver.
type Option func(*Driver)

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(d *Driver) { d.log = l } }

// WithMetrics sets the metrics sink.
func WithMetrics(m Metrics) Option { return func(d *Driver) { d.metrics = m } }

// WithReported taints the ResourceSlice's devices by h's health
// (gpunode's Reported: at most one change per --health-update-interval)
// instead of the tracker's.
func WithReported(h Health) Option { return func(d *Driver) { d.reported = h } }

// WithHealthTiming sets how often the health stream re-sends an unchanged
// report and the timeout after which kubelet reports a device Unknown
// without one (default 10s and 30s).
func WithHealthTiming(resend, lease time.Duration) Option {
	return func(d *Driver) { d.resend, d.healthLease = resend, lease }
}

// ClaimLookup reads a ResourceClaim from the API server: nil, nil when it
// does not exist.
type ClaimLookup func(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)

// WithClaimLookup lets prepare tell a GPU still prepared for a deleted or
// deallocated claim (kubelet unprepares it later) from one held by a live
// claim.
func WithClaimLookup(f ClaimLookup) Option { return func(d *Driver) { d.lookup = f } }

// WithClaimSpecs lets prepare share a claim (GpuConfig sharing
// TimeSlicing): its own CDI device goes into a per-claim spec in dir. New
// removes the per-claim specs of claims the checkpoint no longer holds and
// writes those of the claims it does.
func WithClaimSpecs(dir claimspec.Dir) Option { return func(d *Driver) { d.claimSpecs = &dir } }

// MPSDaemons runs MPS control daemons (gpunode's ClaimMPS).
type MPSDaemons interface {
	// Sync runs exactly ds; an error says why none can run.
	Sync(ds []mps.Daemon) error
	// Wait returns once daemon id listens with its limits set.
	Wait(ctx context.Context, id string) error
	// Client is the host paths a client of daemon id mounts: its pipe
	// directory and the daemons' shared memory.
	Client(id string) (pipe, shm string)
}

// WithMPS runs the MPS daemons of claims whose GpuConfig shares by MPS.
func WithMPS(m MPSDaemons) Option { return func(d *Driver) { d.mps = m } }

// WithShares publishes beside each GPU without MIG its share device
// (contract.DRAShareDeviceName): claims of class contract.DRAShareClass each
// consume part of its memory and compute (KEP-5075 consumable capacity),
// enforced by the share's own MPS daemon (WithMPS). Every GPU then gets a
// counter set, so the scheduler never allocates a GPU whole and in shares.
func WithShares() Option { return func(d *Driver) { d.shares = true } }

// WithFatal is called with background errors the driver cannot recover
// from (the daemon cancels its context).
func WithFatal(f func(error)) Option { return func(d *Driver) { d.fatal = f } }

// New returns the driver for node's selected GPUs (a GPU with MIG mode on
// stands for its MIG devices); cdiName maps a GPU or MIG UUID to its device
// name in the shared CDI spec. pool is the node name.
func New(pool string, node gpu.Node, selected []gpu.Device, cdiName func(uuid string) string, h Health, state *checkpoint.Store, opts ...Option) (*Driver, error) {
	if pool == "" {
		return nil, errors.New("the DRA driver needs the node name (--node-name, env NODE_NAME from the downward API)")
	}
	if len(selected) == 0 {
		return nil, errors.New("no GPU to publish; check the GPU selection (NVIDIA_VISIBLE_DEVICES, ConfigMap key selected-gpu-uuid)")
	}
	d := &Driver{
		driver: contract.DRADriver, pool: pool, node: node, byName: map[string]Device{},
		health: h, state: state, log: slog.Default(), metrics: NopMetrics{},
		resend: 10 * time.Second, healthLease: 30 * time.Second, fatal: func(error) {},
		unhealthySince: map[string]time.Time{}, held: map[string]heldTaint{}, republish: make(chan struct{}, 1),
		cdiName: cdiName, parents: map[string]gpu.Device{},
	}
	for _, o := range opts {
		o(d)
	}
	if d.reported == nil {
		d.reported = h
	}
	for _, g := range selected {
		d.parents[g.UUID] = g
	}
	if err := d.dropPending(); err != nil {
		return nil, err
	}
	owned := ownedSlots(d.state.All())
	slots := map[string][]Device{}
	for _, g := range selected {
		if d.onDemand(g, owned) {
			devs, err := d.slotDevices(g)
			if err != nil {
				return nil, err
			}
			slots[g.UUID] = devs
		}
	}
	for _, g := range selected {
		devs := []Device{{Device: g, Name: DeviceName(g), CDIName: cdiName(g.UUID)}}
		if d.shares && !g.MIGEnabled {
			devs = append(devs, Device{Device: g, Share: true, Name: contract.DRAShareDeviceName(g.Index), CDIName: cdiName(g.UUID)})
		}
		if g.MIGEnabled {
			devs = devs[:0]
			if s, ok := slots[g.UUID]; ok {
				devs = s
			}
			for i := range g.MIG {
				if slots[g.UUID] != nil {
					break
				}
				m := &g.MIG[i]
				devs = append(devs, Device{Device: g, MIG: m, Name: contract.DRAMIGDeviceName(g.Index, m.Profile, m.GPUInstance, m.ComputeInstance), CDIName: cdiName(m.UUID)})
			}
		}
		for _, dev := range devs {
			if _, dup := d.byName[dev.Name]; dup {
				return nil, fmt.Errorf("%s and another device are both named %s; each published GPU needs its own index", dev.Describe(), dev.Name)
			}
			d.byName[dev.Name] = dev
			d.devices = append(d.devices, dev)
		}
	}
	if len(d.devices) == 0 {
		return nil, errors.New("no device to publish: the selected GPUs have MIG mode on but no MIG devices; create them (nvidia-smi mig -cgi <profiles> -C) or disable MIG (nvidia-smi -i <index> -mig 0)")
	}
	d.counters = counterSets(selected, d.shares, slots)
	if err := d.restoreClaimSpecs(); err != nil {
		return nil, err
	}
	d.metrics.SetPreparedClaims(state.Len())
	return d, nil
}

// Devices are the published devices in publication order.
func (d *Driver) Devices() []Device { return d.devices }

// Pool is the ResourceSlice pool (the node name).
func (d *Driver) Pool() string { return d.pool }

// HandleError is the helper's report of a background failure (publishing
// ResourceSlices, the gRPC servers). Recoverable errors are logged; others
// end the driver.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.metrics.BackgroundError()
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) && slices.Contains(dropped.DisabledFeatures(), "DRAPartitionableDevices") {
		msg += "; the API server dropped the MIG GPUs' counters: enable its DRAPartitionableDevices feature gate (beta, on by default from Kubernetes 1.36), or set MIG_STRATEGY=none"
	}
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.log.ErrorContext(ctx, msg, "error", err)
		return
	}
	d.log.ErrorContext(ctx, msg+"; stopping", "error", err)
	d.fatal(fmt.Errorf("%s: %w", msg, err))
}
