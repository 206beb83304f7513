package driver

import (
	"context"
	"fmt"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// WatchHealthStatus serves kubelet's KEP-4680 NodeWatchResources stream:
// a report of every GPU now, again on every health change, and at least
// every resend interval so kubelet never lets it lapse to Unknown.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	changed, cancel := d.health.Subscribe()
	defer cancel()
	d.metrics.HealthStream(1)
	defer d.metrics.HealthStream(-1)
	tick := time.NewTicker(d.resend)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case reports <- d.HealthReport():
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

// HealthReport is every device's health as kubelet's health service wants
// it: a MIG device has its parent GPU's.
func (d *Driver) HealthReport() kubeletplugin.DeviceHealthReport {
	byUUID := map[string][]Device{}
	for _, g := range d.devices {
		byUUID[g.UUID] = append(byUUID[g.UUID], g)
	}
	now := time.Now()
	var r kubeletplugin.DeviceHealthReport
	for _, s := range d.health.States() {
		for _, g := range byUUID[s.UUID] {
			who := g.UUID
			if g.MIG != nil {
				who = g.MIG.UUID + " on " + g.UUID
			}
			h := kubeletplugin.DeviceHealth{
				PoolName: d.pool, DeviceName: g.Name, Health: kubeletplugin.HealthStatusHealthy,
				LastUpdated: now, HealthCheckTimeout: d.healthLease, Message: who + " healthy",
			}
			if !s.Healthy {
				h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, who+": "+s.Reason
			}
			r.Devices = append(r.Devices, h)
		}
	}
	return r
}

// Publisher publishes ResourceSlices; *kubeletplugin.Helper satisfies it.
type Publisher interface {
	PublishResources(ctx context.Context, r resourceslice.DriverResources) error
}

// Publish publishes the ResourceSlice now and again on every reported
// health change and SetHeld (taints), until ctx ends. A failure to start
// publishing ends it.
func (d *Driver) Publish(ctx context.Context, p Publisher) error {
	changed, cancel := d.reported.Subscribe()
	defer cancel()
	for {
		if err := p.PublishResources(ctx, d.Resources()); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("publish the ResourceSlice: %w; check the API server connection and nvinject-dra's RBAC for resourceslices", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-d.republish:
		}
	}
}
