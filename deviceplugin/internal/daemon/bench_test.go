package daemon

import (
	"context"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func percentiles(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	at := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// BenchmarkAnchorOptionsOverSocket is the anchor for the Allocate figure:
// GetDevicePluginOptions, an RPC that does no work, over the same socket,
// so the ratio isolates Allocate's own cost from gRPC's.
func BenchmarkAnchorOptionsOverSocket(b *testing.B) {
	r := start(b, "sim:a100-80gb*8")
	untilHealth(b, r.watch(b), simUUID(3), pluginapi.Healthy)
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := r.client.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	percentiles(b, lat)
}

// BenchmarkAllocateOverSocket is kubelet's Allocate of one GPU over the
// plugin's unix socket (annotations + CRI strategies).
func BenchmarkAllocateOverSocket(b *testing.B) {
	r := start(b, "sim:a100-80gb*8")
	untilHealth(b, r.watch(b), simUUID(3), pluginapi.Healthy)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{simUUID(3)}}}}
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := r.client.Allocate(context.Background(), req); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	percentiles(b, lat)
}

// BenchmarkXidToListAndWatch is the time from a simulated Xid entering
// NVML's event set to kubelet receiving the Unhealthy list, with the
// health checkpoint written (fsync) on every change.
func BenchmarkXidToListAndWatch(b *testing.B) { benchXid(b) }

// BenchmarkXidToListAndWatchNoCheckpoint is the same with --state-dir=
// (health in memory only): the checkpoint's share of the figure above.
func BenchmarkXidToListAndWatchNoCheckpoint(b *testing.B) { benchXid(b, "--state-dir=") }

func benchXid(b *testing.B, args ...string) {
	r := start(b, "sim:a100-80gb*8", args...)
	next := r.watch(b)
	untilHealth(b, next, simUUID(0), pluginapi.Healthy)
	rec := r.tracker.Load()
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := r.sim.InjectXid(simUUID(0), 79); err != nil {
			b.Fatal(err)
		}
		untilHealth(b, next, simUUID(0), pluginapi.Unhealthy)
		lat = append(lat, time.Since(t0))
		if err := rec.Recover(context.Background(), simUUID(0)); err != nil {
			b.Fatal(err)
		}
		untilHealth(b, next, simUUID(0), pluginapi.Healthy)
	}
	percentiles(b, lat)
}

// BenchmarkAllocateMIGvsWhole is kubelet's Allocate of a MIG device and of
// a whole GPU on one MIG_STRATEGY=mixed node, in one run: the anchor is the
// whole GPU, served the same way over its own socket.
func BenchmarkAllocateMIGvsWhole(b *testing.B) {
	r := startExpecting(b, mixedResources, mixedNode, "--mig-strategy=mixed", "--visible-devices=all")
	mig := watchClient(b, r.clients["nvidia.com/mig-1g.10gb"])()[0].ID
	for _, c := range []struct {
		name   string
		client pluginapi.DevicePluginClient
		id     string
	}{
		{"whole", r.clients["nvidia.com/gpu"], simUUID(0)},
		{"mig", r.clients["nvidia.com/mig-1g.10gb"], mig},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{c.id}}}}
			var lat []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if _, err := c.client.Allocate(context.Background(), req); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			percentiles(b, lat)
		})
	}
}
