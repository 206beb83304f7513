package driver

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvinject/nvinject/gpunode/health"
	"github.com/nvinject/nvinject/shared/contract"
)

// Taint values: why a device is tainted.
const (
	TaintXid        = "xid"
	TaintLost       = "gpu-lost"
	TaintMonitoring = "monitoring"
)

// Resources is the node's ResourceSlice content for the current health:
// one pool named after the node, one slice, one device per GPU; an
// Unhealthy GPU carries a NoSchedule taint so no new claim gets it, while
// running pods keep it (their allocatedResourcesStatus says Unhealthy). A
// GPU a device-plugin pod still holds (SetHeld) carries another, and so
// does every GPU while that cannot be told (SetHeldUnknown).
func (d *Driver) Resources() resourceslice.DriverResources {
	states := map[string]health.State{}
	for _, s := range d.health.States() {
		states[s.UUID] = s
	}
	now := time.Now()
	devs := make([]resourceapi.Device, 0, len(d.devices))
	d.mu.Lock()
	for _, g := range d.devices {
		dev := d.sliceDevice(g)
		if s, ok := states[g.UUID]; ok && !s.Healthy {
			since, seen := d.unhealthySince[g.UUID]
			if !seen {
				since = now
				d.unhealthySince[g.UUID] = since
			}
			dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{
				Key: contract.DRATaintKey, Value: TaintValue(s.Reason),
				Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &metav1.Time{Time: since},
			})
		} else {
			delete(d.unhealthySince, g.UUID)
		}
		if t, held := d.held[g.UUID]; held {
			dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{
				Key: contract.DRAHeldTaintKey, Value: t.value,
				Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &metav1.Time{Time: t.since},
			})
		}
		devs = append(devs, dev)
	}
	d.mu.Unlock()
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.pool: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}
}

// TaintValue condenses a tracker reason into a label value.
func TaintValue(reason string) string {
	switch {
	case strings.HasPrefix(reason, "GPU lost"):
		return TaintLost
	case strings.HasPrefix(reason, "Xid "):
		return TaintXid
	}
	return TaintMonitoring
}

func (d *Driver) sliceDevice(g Device) resourceapi.Device {
	str := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &v} }
	num := func(v int) resourceapi.DeviceAttribute {
		i := int64(v)
		return resourceapi.DeviceAttribute{IntValue: &i}
	}
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		contract.DRAAttrUUID:                            str(g.UUID),
		contract.DRAAttrProductName:                     str(g.Device.Name),
		contract.DRAAttrIndex:                           num(g.Index),
		contract.DRAAttrMinor:                           num(g.Minor),
		deviceattribute.StandardDeviceAttributePCIBusID: str(g.PCIBusID),
	}
	version := func(name, v string) {
		if sv, ok := SemVer(v); ok {
			attrs[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{VersionValue: &sv}
		}
	}
	version(contract.DRAAttrDriverVersion, d.node.DriverVersion)
	version(contract.DRAAttrCUDADriverVersion, d.node.CUDAVersion)
	version(contract.DRAAttrComputeCapability, g.ComputeCapability)
	if g.Architecture != "" {
		attrs[contract.DRAAttrArchitecture] = str(g.Architecture)
	}
	if g.NUMANode >= 0 {
		attrs[contract.DRAAttrNUMANode] = num(g.NUMANode)
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = num(g.NUMANode)
	}
	return resourceapi.Device{
		Name:       g.Name,
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			contract.DRACapacityMemory: {Value: *resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI)},
		},
	}
}

// SemVer turns NVIDIA's dotted versions ("580.95.05", "13.0", "8.0") into
// the semantic versions VersionValue needs ("580.95.5", "13.0.0", "8.0.0").
func SemVer(v string) (string, bool) {
	parts := strings.Split(v, ".")
	if v == "" || len(parts) > 3 {
		return "", false
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return "", false
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return fmt.Sprintf("%s.%s.%s", parts[0], parts[1], parts[2]), true
}

// SetHeld replaces the set of GPUs that pods given them by the device plugin
// still hold (UUID → holders) and republishes the ResourceSlice.
func (d *Driver) SetHeld(holders map[string][]string) {
	now := time.Now()
	d.mu.Lock()
	for u, t := range d.held {
		if _, ok := holders[u]; !ok {
			delete(d.held, u)
			if t.value == contract.DRAHeldTaintValue {
				d.log.Info("GPU no longer held by a device-plugin pod; new claims may get it", "uuid", u)
			}
		}
	}
	for u, h := range holders {
		if t, ok := d.held[u]; (!ok || t.value != contract.DRAHeldTaintValue) && slices.ContainsFunc(d.devices, func(g Device) bool { return g.UUID == u }) {
			d.held[u] = heldTaint{value: contract.DRAHeldTaintValue, since: now}
			d.log.Info("GPU held by device-plugin pods; tainted until they end", "uuid", u, "holders", h, "taint", contract.DRAHeldTaintKey+"="+contract.DRAHeldTaintValue)
		}
	}
	d.mu.Unlock()
	d.kick()
}

// SetHeldUnknown taints every GPU held with value unknown, until the next
// SetHeld: which GPUs device-plugin pods hold cannot be read, so no claim
// may get any (fail closed).
func (d *Driver) SetHeldUnknown() {
	now := time.Now()
	d.mu.Lock()
	for _, g := range d.devices {
		if t, ok := d.held[g.UUID]; !ok || t.value != contract.DRAHeldTaintUnknown {
			d.held[g.UUID] = heldTaint{value: contract.DRAHeldTaintUnknown, since: now}
		}
	}
	d.mu.Unlock()
	d.kick()
}

// kick asks Publish to republish the ResourceSlice.
func (d *Driver) kick() {
	select {
	case d.republish <- struct{}{}:
	default:
	}
}
