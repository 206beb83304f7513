package daemon

import (
	"context"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// lists streams ListAndWatch into a channel, closed when the stream ends.
func lists(t *testing.T, client pluginapi.DevicePluginClient) <-chan []*pluginapi.Device {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan []*pluginapi.Device, 256)
	go func() {
		defer close(out)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			out <- resp.Devices
		}
	}()
	return out
}

// TestFlappingGPUListsBounded: a GPU flapping (Xid, then recovery) much
// faster than --health-update-interval reaches kubelet at most once per
// interval plus the final list, the first Xid at once, and the last list
// is the true health; the tracker and Allocate follow every flap.
func TestFlappingGPUListsBounded(t *testing.T) {
	const interval = 500 * time.Millisecond
	r := start(t, "sim:a100-80gb*2", "--health-update-interval="+interval.String())
	got := lists(t, r.client)
	if h := healthOf(<-got); h[simUUID(0)] != pluginapi.Healthy || h[simUUID(1)] != pluginapi.Healthy {
		t.Fatalf("first list %v; want every GPU Healthy", h)
	}
	tr := r.tracker.Load()
	changed, cancel := tr.Subscribe()
	defer cancel()
	const flaps = 20
	began := time.Now()
	for range flaps {
		if err := r.sim.InjectXid(simUUID(0), 48); err != nil {
			t.Fatal(err)
		}
		waitFor(t, changed, func() bool { return !tr.Healthy(simUUID(0)) })
		if err := tr.Recover(context.Background(), simUUID(0)); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(began)

	var sent [][]*pluginapi.Device
	for quiet := false; !quiet; {
		select {
		case l, ok := <-got:
			if !ok {
				t.Fatal("ListAndWatch ended")
			}
			sent = append(sent, l)
		case <-time.After(4 * interval):
			quiet = true
		}
	}
	if len(sent) == 0 || healthOf(sent[0])[simUUID(0)] != pluginapi.Unhealthy {
		t.Fatalf("lists after the first Xid: %d, first %v; want the Xid's Unhealthy list at once", len(sent), sent)
	}
	if h := healthOf(sent[len(sent)-1]); h[simUUID(0)] != pluginapi.Healthy || h[simUUID(1)] != pluginapi.Healthy {
		t.Fatalf("last list %v; want the true health: every GPU Healthy", h)
	}
	if limit := int(took/interval) + 2; len(sent) > limit {
		t.Errorf("%d lists for %d flaps in %s; want at most %d (one per %s, plus the final)", len(sent), flaps, took, limit, interval)
	}
}

// waitFor waits, on ch's notifications, until cond holds.
func waitFor(t *testing.T, ch <-chan struct{}, cond func() bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-ch:
		case <-timeout:
			t.Fatal("condition not reached in 10s")
		}
	}
}
