package driver

import (
	"slices"
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

// Resources is the node's ResourceSlice content for the reported health:
// one pool named after the node, one device per whole GPU or MIG device;
// an Unhealthy GPU's devices carry a NoSchedule taint so no new claim gets
// them, while running pods keep them (their allocatedResourcesStatus says
// Unhealthy). A device a device-plugin pod still holds, itself or its
// parent GPU (SetHeld), carries another, and so does every device while
// that cannot be told (SetHeldUnknown). Where a GPU has MIG on, the GPUs'
// counter sets come first, in slices of their own (see slices).
func (d *Driver) Resources() resourceslice.DriverResources {
	states := map[string]health.State{}
	for _, s := range d.reported.States() {
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
		t, held := d.held[g.ID()]
		if !held {
			t, held = d.held[g.UUID]
		}
		if held {
			dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{
				Key: contract.DRAHeldTaintKey, Value: t.value,
				Effect: resourceapi.DeviceTaintEffectNoSchedule, TimeAdded: &metav1.Time{Time: t.since},
			})
		}
		devs = append(devs, dev)
	}
	d.mu.Unlock()
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{d.pool: {Slices: d.slices(devs)}}}
}

// slices lays the pool out as the API validates a ResourceSlice: counter
// sets and devices never share one, a slice holds at most 8 counter sets,
// and at most 64 devices once any device consumes counters or is tainted.
func (d *Driver) slices(devs []resourceapi.Device) []resourceslice.Slice {
	var out []resourceslice.Slice
	for c := range slices.Chunk(d.counters, resourceapi.ResourceSliceMaxCounterSets) {
		out = append(out, resourceslice.Slice{SharedCounters: c})
	}
	for c := range slices.Chunk(devs, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures) {
		out = append(out, resourceslice.Slice{Devices: c})
	}
	return out
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

// sliceDevice is g's ResourceSlice device. A MIG device carries its
// parent's facts (product, versions, PCI bus, NUMA node) and its own
// (profile, GI and CI, memory, multiprocessors).
func (d *Driver) sliceDevice(g Device) resourceapi.Device {
	str := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &v} }
	num := func(v int) resourceapi.DeviceAttribute {
		i := int64(v)
		return resourceapi.DeviceAttribute{IntValue: &i}
	}
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		contract.DRAAttrType:                            str(contract.DRATypeGPU),
		contract.DRAAttrUUID:                            str(g.UUID),
		contract.DRAAttrProductName:                     str(g.Device.Name),
		contract.DRAAttrIndex:                           num(g.Index),
		contract.DRAAttrMinor:                           num(g.Minor),
		contract.DRAAttrMIGCapable:                      {BoolValue: &g.MIGCapable},
		deviceattribute.StandardDeviceAttributePCIBusID: str(g.PCIBusID),
	}
	capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		contract.DRACapacityMemory: {Value: bytesQuantity(g.MemoryBytes)},
	}
	allowMultiple := (*bool)(nil)
	if g.Share {
		attrs[contract.DRAAttrType] = str(contract.DRATypeShare)
		capacity = shareCapacity(g.MemoryBytes)
		allowMultiple = &g.Share
	}
	if s := g.Slot; s != nil {
		delete(attrs, contract.DRAAttrIndex)
		delete(attrs, contract.DRAAttrMinor)
		delete(attrs, contract.DRAAttrUUID)
		onDemand := true
		attrs[contract.DRAAttrType] = str(contract.DRATypeMIG)
		attrs[contract.DRAAttrParentUUID] = str(g.UUID)
		attrs[contract.DRAAttrParentIndex] = num(g.Index)
		attrs[contract.DRAAttrProfile] = str(s.Profile)
		attrs[contract.DRAAttrMIGOnDemand] = resourceapi.DeviceAttribute{BoolValue: &onDemand}
		attrs[contract.DRAAttrPlacementStart] = num(s.Placement.Start)
		attrs[contract.DRAAttrPlacementSize] = num(s.Placement.Size)
		capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			contract.DRACapacityMemory:          {Value: bytesQuantity(s.MemoryBytes)},
			contract.DRACapacityMultiprocessors: {Value: *resource.NewQuantity(int64(s.Multiprocessors), resource.DecimalSI)},
		}
	}
	if m := g.MIG; m != nil {
		delete(attrs, contract.DRAAttrIndex)
		delete(attrs, contract.DRAAttrMinor)
		attrs[contract.DRAAttrType] = str(contract.DRATypeMIG)
		attrs[contract.DRAAttrUUID] = str(m.UUID)
		attrs[contract.DRAAttrParentUUID] = str(g.UUID)
		attrs[contract.DRAAttrParentIndex] = num(g.Index)
		attrs[contract.DRAAttrProfile] = str(m.Profile)
		attrs[contract.DRAAttrMIGGI] = num(m.GPUInstance)
		attrs[contract.DRAAttrMIGCI] = num(m.ComputeInstance)
		capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			contract.DRACapacityMemory:          {Value: bytesQuantity(m.MemoryBytes)},
			contract.DRACapacityMultiprocessors: {Value: *resource.NewQuantity(int64(m.Multiprocessors), resource.DecimalSI)},
		}
	}
	version := func(name, v string) {
		if sv, ok := contract.DRASemVer(v); ok {
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
	return resourceapi.Device{Name: g.Name, Attributes: attrs, Capacity: capacity, ConsumesCounters: d.consumes(g), AllowMultipleAllocations: allowMultiple}
}

// Share request policy: memory in steps of ShareMemoryStep from one step
// to the whole GPU, ShareMemoryDefault when the request names none; compute
// in whole percents, ShareComputeDefault when the request names none.
const (
	ShareMemoryStep     = 256 << 20
	ShareMemoryDefault  = 1 << 30
	ShareComputeDefault = 10
)

// shareCapacity is a share device's consumable capacity (KEP-5075): the
// GPU's memory and 100 compute percent, each with its request policy, so
// the scheduler hands out shares whose sum fits the GPU.
func shareCapacity(memory uint64) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	q := func(v int64, f resource.Format) *resource.Quantity { return resource.NewQuantity(v, f) }
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		contract.DRACapacityMemory: {Value: bytesQuantity(memory), RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default:    q(ShareMemoryDefault, resource.BinarySI),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q(ShareMemoryStep, resource.BinarySI), Max: q(int64(memory), resource.BinarySI), Step: q(ShareMemoryStep, resource.BinarySI)},
		}},
		contract.DRACapacityComputePercent: {Value: *q(100, resource.DecimalSI), RequestPolicy: &resourceapi.CapacityRequestPolicy{
			Default:    q(ShareComputeDefault, resource.DecimalSI),
			ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q(1, resource.DecimalSI), Max: q(100, resource.DecimalSI), Step: q(1, resource.DecimalSI)},
		}},
	}
}

// SetHeld replaces the set of GPUs and MIG devices that pods given them by
// the device plugin still hold (UUID → holders) and republishes the
// ResourceSlice. A held GPU withholds its MIG devices too.
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
		if t, ok := d.held[u]; (!ok || t.value != contract.DRAHeldTaintValue) && slices.ContainsFunc(d.devices, func(g Device) bool { return g.UUID == u || g.ID() == u }) {
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
