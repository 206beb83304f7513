package resolve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

// BenchmarkFreshnessUnderChurn measures how long a spec added to, then
// removed from, a directory of 200 good spec files takes to show in
// Resolve (resolvable, then refused as unresolvable) while 100 other spec
// files are written and deleted as fast as possible. Its anchor, in the
// same run, is the same change with the directory quiet.
func BenchmarkFreshnessUnderChurn(b *testing.B) {
	for _, churning := range []bool{false, true} {
		b.Run(map[bool]string{false: "anchor-quiet", true: "churn"}[churning], func(b *testing.B) {
			dir := b.TempDir()
			for i := range 200 {
				writeSpec(b, dir, fmt.Sprintf("good%03d.yaml", i), fmt.Sprintf("good%d.example.com/dev", i), "d")
			}
			r, err := New([]string{dir})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			if churning {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; ctx.Err() == nil; n++ {
						p := filepath.Join(dir, fmt.Sprintf("churn%03d.yaml", n%100))
						if n%2 == 0 {
							writeSpec(b, dir, filepath.Base(p), fmt.Sprintf("churn%d.example.com/dev", n%100), "d")
						} else {
							_ = os.Remove(p)
						}
					}
				}()
			}
			var lags []time.Duration
			wait := func(name string, want bool) time.Duration {
				t0 := time.Now()
				for {
					_, err := r.Resolve([]string{name}, oci.User{})
					var u *UnresolvableError
					if (err == nil) == want && (want || errors.As(err, &u)) {
						return time.Since(t0)
					}
					if time.Since(t0) > 10*time.Second {
						b.Fatalf("%s: resolvable=%v not reached in 10s: %v", name, want, err)
					}
					time.Sleep(200 * time.Microsecond)
				}
			}
			b.ResetTimer()
			for i := range b.N {
				writeSpec(b, dir, "probe.yaml", "probe.example.com/dev", fmt.Sprintf("d%d", i))
				lags = append(lags, wait(fmt.Sprintf("probe.example.com/dev=d%d", i), true))
				if err := os.Remove(filepath.Join(dir, "probe.yaml")); err != nil {
					b.Fatal(err)
				}
				lags = append(lags, wait(fmt.Sprintf("probe.example.com/dev=d%d", i), false))
			}
			b.StopTimer()
			cancel()
			wg.Wait()
			slices.Sort(lags)
			b.ReportMetric(float64(lags[len(lags)/2].Milliseconds()), "p50-lag-ms")
			b.ReportMetric(float64(lags[len(lags)*99/100].Milliseconds()), "p99-lag-ms")
			b.ReportMetric(float64(lags[len(lags)-1].Milliseconds()), "max-lag-ms")
		})
	}
}
