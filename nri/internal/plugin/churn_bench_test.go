package plugin_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvinject/nvinject/nri/internal/collect"
	"github.com/nvinject/nvinject/nri/internal/metrics"
	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/shared/contract"
)

// otherSpec is a 4-device spec of another vendor, like the 199 beside
// nvinject's in BenchmarkCreateContainer.
func otherSpec(i int) []byte {
	s := fmt.Sprintf("cdiVersion: 0.6.0\nkind: vendor%d.example.com/dev\ndevices:\n", i)
	for d := range 4 {
		s += fmt.Sprintf("- name: d%d\n  containerEdits:\n    env: [DEV%d_%d=1]\n    deviceNodes: [{path: /dev/x%d_%d, type: c, major: 10, minor: %d}]\n", d, i, d, i, d, d)
	}
	return []byte(s)
}

// churn floods dir until ctx ends: every 100ms it writes, then next time
// deletes, each of 100 spec files (1000 file operations a second; a device
// plugin writes its spec once per start). It returns the operations made.
func churn(ctx context.Context, dir string) int {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ops := 0; ; {
		write := ops%200 == 0
		for i := range 100 {
			p := filepath.Join(dir, fmt.Sprintf("churn%03d.yaml", i))
			if write {
				_ = os.WriteFile(p, otherSpec(1000+i), 0o644)
			} else {
				_ = os.Remove(p)
			}
			ops++
		}
		select {
		case <-ctx.Done():
			return ops
		case <-tick.C:
		}
	}
}

var quietP99, writerP99 time.Duration

// BenchmarkCreateContainerChurn measures the CreateContainer handler (one
// GPU) with 200 good spec files in the spec dir, first quiet, then while
// 100 other spec files are written and deleted as fast as possible (same
// run). Calls are paced one per millisecond (a node creating 1000
// containers a second), so the churn phase spans many reloads. A third
// case floods a directory the resolver does not watch: the cost of the
// writer alone on this machine's CPUs, so the churn case also reports its
// p99 against that. The churn case reports its p99 as a ratio of the quiet p99 (the
// target is at most 2) and how many snapshots the resolver swapped in.
func BenchmarkCreateContainerChurn(b *testing.B) {
	node := nritest.NewNode(b, "sim:a100-80gb*8", true)
	for i := range 199 {
		if err := os.WriteFile(filepath.Join(node.SpecDir, fmt.Sprintf("vendor%03d.yaml", i)), otherSpec(i), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	res, err := resolve.New([]string{node.SpecDir})
	if err != nil {
		b.Fatal(err)
	}
	defer res.Close()
	col, _ := collect.New()
	h := plugin.NewHandler(col, res, plugin.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		plugin.WithMetrics(metrics.New(prometheus.NewRegistry())))
	pod := nritest.Pod("p", contract.RuntimeHandler, nil)
	ctr := nritest.Container("c", "p", "main", nritest.BaseSpec(), map[string]string{contract.DevicesAnnotation: node.Name(0)})
	run := func(b *testing.B) time.Duration {
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for range b.N {
			<-tick.C
			t0 := time.Now()
			adj, _, err := h.CreateContainer(context.Background(), pod, ctr)
			lat = append(lat, time.Since(t0))
			if err != nil || len(adj.GetLinux().GetDevices()) == 0 {
				b.Fatalf("CreateContainer: %v", err)
			}
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		return lat[len(lat)*99/100]
	}
	b.Run("quiet", func(b *testing.B) { quietP99 = run(b) })
	flooded := func(b *testing.B, dir string) time.Duration {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var ops int
		wg.Add(1)
		go func() { defer wg.Done(); ops = churn(ctx, dir) }()
		reloads := res.Reloads()
		p99 := run(b)
		cancel()
		wg.Wait()
		b.ReportMetric(float64(ops), "file-ops")
		b.ReportMetric(float64(res.Reloads()-reloads), "reloads")
		if quietP99 > 0 {
			b.ReportMetric(float64(p99)/float64(quietP99), "p99/quiet-p99")
		}
		return p99
	}
	b.Run("anchor-writer-only", func(b *testing.B) { writerP99 = flooded(b, b.TempDir()) })
	b.Run("churn", func(b *testing.B) {
		if p99 := flooded(b, node.SpecDir); writerP99 > 0 {
			b.ReportMetric(float64(p99)/float64(writerP99), "p99/writer-only-p99")
		}
	})
}
