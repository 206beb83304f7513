package plugin_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/nri/internal/collect"
	"github.com/nvinject/nvinject/nri/internal/metrics"
	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
)

// BenchmarkCreateContainer measures the CreateContainer handler with 200
// spec files in the spec dir (nvinject's plus 199 other vendors'), and
// reports per-call p50 and p99. Its anchor, measured in the same run, is
// containerd's own per-container CDI work: the CDI library's InjectDevices
// of the same names from the same spec dir.
func BenchmarkCreateContainer(b *testing.B) {
	node := nritest.NewNode(b, "sim:a100-80gb*8", true)
	for i := range 199 {
		spec := fmt.Sprintf("cdiVersion: 0.6.0\nkind: vendor%d.example.com/dev\ndevices:\n", i)
		for d := range 4 {
			spec += fmt.Sprintf("- name: d%d\n  containerEdits:\n    env: [DEV%d_%d=1]\n    deviceNodes: [{path: /dev/x%d_%d, type: c, major: 10, minor: %d}]\n", d, i, d, i, d, d)
		}
		if err := os.WriteFile(filepath.Join(node.SpecDir, fmt.Sprintf("vendor%03d.yaml", i)), []byte(spec), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	res, err := resolve.New([]string{node.SpecDir})
	if err != nil {
		b.Fatal(err)
	}
	defer res.Close()
	if errs := res.SpecErrors(); len(errs) > 0 {
		b.Fatalf("fixture specs failed to load: %v", errs)
	}
	col, _ := collect.New()
	h := plugin.NewHandler(col, res, plugin.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		plugin.WithMetrics(metrics.New(prometheus.NewRegistry())), plugin.WithInventory(verify.InventoryOf(node.Node)))

	cache, err := cdi.NewCache(cdi.WithSpecDirs(node.SpecDir), cdi.WithAutoRefresh(false))
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 8} {
		var names []string
		for i := range n {
			names = append(names, node.Name(i))
		}
		b.Run(fmt.Sprintf("anchor-cdi-inject/gpus=%d", n), func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if _, err := cache.InjectDevices(nritest.BaseSpec(), names...); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			pod := nritest.Pod("p", "nvidia", nil)
			ctr := nritest.Container("c", "p", "main", nritest.BaseSpec(), map[string]string{contract.DevicesAnnotation: strings.Join(names, ",")})
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				adj, _, err := h.CreateContainer(ctx, pod, ctr)
				lat = append(lat, time.Since(t0))
				if err != nil || len(adj.GetLinux().GetDevices()) < n {
					b.Fatalf("CreateContainer: %v, %d devices", err, len(adj.GetLinux().GetDevices()))
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
