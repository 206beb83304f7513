package daemon

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/gpunode/kubelet"
	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

type emptyPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

// BenchmarkAnchorStartBareRegistrar is the anchor for the start figures:
// a registrar serving an empty DevicePlugin service starts and registers
// with a waiting kubelet, the floor of any plugin's start.
func BenchmarkAnchorStartBareRegistrar(b *testing.B) {
	var reg []time.Duration
	for b.Loop() {
		dir := kubelettest.Dir(b)
		k := kubelettest.Start(b, dir)
		r := kubelet.New(dir, "p.sock", "nvidia.com/gpu", emptyPlugin{}, kubelet.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		t0 := time.Now()
		go func() { done <- r.Run(ctx) }()
		k.WaitRegister(b, 10*time.Second)
		reg = append(reg, time.Since(t0))
		b.StopTimer()
		cancel()
		<-done
		b.StartTimer()
	}
	percentiles(b, reg)
}

// BenchmarkStartToFirstHealthyList is the whole plugin starting on a
// simulated 8-GPU node: NVML opened, GPUs discovered, CDI spec written,
// health watch armed and every GPU checked, Register sent (p50/p99 and
// reg-p50), and the first ListAndWatch list received with every GPU
// Healthy (list-p50). Before, kubelet got an all-Unhealthy list first and
// the Healthy one 500 ms later.
func BenchmarkStartToFirstHealthyList(b *testing.B) {
	const nvmlSpec = "sim:a100-80gb*8"
	root := driverRoot(b, nvmlSpec)
	open := func(v string, _ backend.Options) (*backend.Backend, error) {
		spec, err := sim.ParseSpec(v)
		if err != nil {
			return nil, err
		}
		node := sim.New(spec)
		// A short event wait keeps each iteration's shutdown short.
		inv, err := nvmlinv.New(node.NVML(), nvmlinv.WithNodeLookup(node.Nodes()), nvmlinv.WithSimulated(), nvmlinv.WithWaitSlice(time.Millisecond))
		return &backend.Backend{Inventory: inv}, err
	}
	var reg, list []time.Duration
	for b.Loop() {
		dir := kubelettest.Dir(b)
		k := kubelettest.Start(b, dir)
		cfg, err := config.Load([]string{"--nvml=" + nvmlSpec, "--kubelet-dir=" + dir, "--cdi-spec-dir=" + filepath.Join(dir, "cdi"),
			"--state-dir=" + filepath.Join(dir, "state"), "--driver-root=" + root, "--metrics-addr=", "--pod-resources-socket=", "--node-labels=false"}, func(string) string { return "" }, io.Discard, io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		d := New(cfg, quietLog(), WithNode(gpunode.WithOpen(open)))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		t0 := time.Now()
		go func() { done <- d.Run(ctx) }()
		req := k.WaitRegister(b, 10*time.Second)
		reg = append(reg, time.Since(t0))
		client := kubelettest.Dial(b, dir, req.Endpoint)
		stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
		if err != nil {
			b.Fatal(err)
		}
		first, err := stream.Recv()
		if err != nil {
			b.Fatal(err)
		}
		list = append(list, time.Since(t0))
		for _, dv := range first.Devices {
			if dv.Health != pluginapi.Healthy {
				b.Fatalf("first list has %s %s", dv.ID, dv.Health)
			}
		}
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	percentiles(b, reg)
	b.ReportMetric(p50(list), "list-p50-µs")
}

func p50(d []time.Duration) float64 {
	c := slices.Clone(d)
	slices.Sort(c)
	return float64(c[len(c)/2].Nanoseconds()) / 1e3
}
