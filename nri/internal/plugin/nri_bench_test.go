package plugin_test

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/nri/internal/audit"
	"github.com/nvinject/nvinject/nri/internal/collect"
	"github.com/nvinject/nvinject/nri/internal/conn"
	"github.com/nvinject/nvinject/nri/internal/events"
	"github.com/nvinject/nvinject/nri/internal/metrics"
	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/logging"
)

// noop is the anchor plugin: it answers CreateContainer with a fixed
// adjustment from memory and accepts every validation.
type noop struct{ adj *api.ContainerAdjustment }

func (n noop) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return n.adj, nil, nil
}

func (noop) ValidateContainerAdjustment(context.Context, *api.ValidateContainerAdjustmentRequest) error {
	return nil
}

func benchHandler(b *testing.B, node nritest.Node, opts ...plugin.Option) *plugin.Handler {
	b.Helper()
	res, err := resolve.New([]string{node.SpecDir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { res.Close() })
	col, _ := collect.New()
	// As in production: the JSON logger at info, the verdict lines written
	// by their own goroutine (main.go's audit.Log).
	log, err := logging.New(io.Discard, logging.JSON, "info")
	if err != nil {
		b.Fatal(err)
	}
	verdicts := audit.NewLog(log, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); verdicts.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	return plugin.NewHandler(col, res, append([]plugin.Option{plugin.WithLogger(log), plugin.WithVerdictLog(verdicts),
		plugin.WithMetrics(metrics.New(prometheus.NewRegistry()))}, opts...)...)
}

func runRunner(b *testing.B, r *conn.Runner) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
}

// BenchmarkNRIRoundTrip measures one container's CreateContainer and
// validation through NRI v0.11.0's real runtime side (pkg/adaptation, as
// containerd 2.2 embeds it) over a real socket. Three runtimes run side by
// side, each with one plugin: the anchor, a no-op plugin that returns
// nvinject's adjustment from memory and accepts every validation;
// nvinject-nri; and nvinject-nri with every verdict also going to the
// audit Events over a fake API server. Each iteration is one round trip on
// each, in rotating order, so all three see the same moment of the
// machine: the ratios are what nvinject's own work costs. busy runs the
// same while other processes keep every CPU busy (as a local node beside
// it would).
func BenchmarkNRIRoundTrip(b *testing.B) {
	node := nritest.NewNode(b, "sim:a100-80gb*8", true)
	h := benchHandler(b, node)
	pod := nritest.Pod("p", contract.RuntimeHandler, nil)
	ctr := nritest.Container("c", "p", "main", nritest.BaseSpec(), map[string]string{contract.DevicesAnnotation: node.Name(0)})
	adj, _, err := h.CreateContainer(context.Background(), pod, proto.Clone(ctr).(*api.Container))
	if err != nil {
		b.Fatal(err)
	}
	sink := events.New(fake.NewClientset().CoreV1())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); sink.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })

	anchor := nritest.NewRuntime(filepath.Join(shortDir(b), "nri.sock"), nil, nil)
	anchor.Start(b)
	s, err := stub.New(noop{adj}, stub.WithPluginName("noop"), stub.WithPluginIdx("10"), stub.WithSocketPath(anchor.Socket))
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	anchor.WaitSynced(b)
	served := func(h *plugin.Handler) *nritest.Runtime {
		rt := nritest.NewRuntime(filepath.Join(shortDir(b), "nri.sock"), nil, nil)
		rt.Start(b)
		runRunner(b, conn.New(h, contract.NRIPluginName, "10", rt.Socket, conn.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))))
		rt.WaitSynced(b)
		return rt
	}
	paths := []*nritest.Runtime{anchor, served(h), served(benchHandler(b, node, plugin.WithAuditor(sink)))}

	measure := func(b *testing.B) {
		lat := make([][]time.Duration, len(paths))
		i := 0
		for b.Loop() {
			for k := range paths {
				p := (i + k) % len(paths)
				c := proto.Clone(ctr).(*api.Container)
				t0 := time.Now()
				got, err := paths[p].Create(context.Background(), pod, c)
				lat[p] = append(lat[p], time.Since(t0))
				if err != nil || len(got.GetLinux().GetDevices()) == 0 {
					b.Fatalf("CreateContainer: %v", err)
				}
			}
			i++
		}
		pct := make([][2]time.Duration, len(paths))
		for p, l := range lat {
			slices.Sort(l)
			pct[p] = [2]time.Duration{l[len(l)/2], l[len(l)*99/100]}
		}
		b.ReportMetric(0, "ns/op")
		b.ReportMetric(float64(pct[0][0].Microseconds()), "anchor-p50-µs")
		b.ReportMetric(float64(pct[1][0].Microseconds()), "p50-µs")
		b.ReportMetric(float64(pct[1][1].Microseconds()), "p99-µs")
		b.ReportMetric(float64(pct[1][0])/float64(pct[0][0]), "p50/anchor")
		b.ReportMetric(float64(pct[1][1])/float64(pct[0][1]), "p99/anchor")
		b.ReportMetric(float64(pct[2][0])/float64(pct[0][0]), "audit-p50/anchor")
		b.ReportMetric(float64(pct[2][1])/float64(pct[0][1]), "audit-p99/anchor")
	}
	b.Run("quiet", measure)
	b.Run("busy", func(b *testing.B) {
		burnCPUs(b)
		measure(b)
	})
}

// burnCPUs keeps every CPU busy from other processes until b ends: this
// test binary run again as a spinner (TestMain's burnEnv).
func burnCPUs(b *testing.B) {
	for range runtime.NumCPU() {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), burnEnv+"=1")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
}

const burnEnv = "NVINJECT_BENCH_BURN_CPU"

var anchorReconnect time.Duration

// BenchmarkReconnect measures how long nvinject-nri takes to be registered
// again after the runtime restarts (the socket goes away and comes back):
// from just before the runtime starts until the plugin is synchronized.
// Its anchor, in the same run, is a plugin that connects the moment the
// runtime's Start returns (the floor: the runtime's own start-up and the
// registration). Before the socket watch, the plugin retried once a second.
func BenchmarkReconnect(b *testing.B) {
	node := nritest.NewNode(b, "sim:a100-80gb", false)
	h := benchHandler(b, node)
	median := func(b *testing.B, lat []time.Duration) time.Duration {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
		return lat[len(lat)/2]
	}
	b.Run("anchor-connect-after-start", func(b *testing.B) {
		rt := nritest.NewRuntime(filepath.Join(shortDir(b), "nri.sock"), nil, nil)
		var lat []time.Duration
		for range b.N {
			t0 := time.Now()
			rt.Start(b)
			s, err := stub.New(noop{}, stub.WithPluginName("noop"), stub.WithPluginIdx("10"), stub.WithSocketPath(rt.Socket))
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			rt.WaitSynced(b)
			lat = append(lat, time.Since(t0))
			s.Stop()
			rt.Stop()
		}
		anchorReconnect = median(b, lat)
	})
	b.Run("nvinject", func(b *testing.B) {
		rt := nritest.NewRuntime(filepath.Join(shortDir(b), "nri.sock"), nil, nil)
		rt.Start(b)
		r := conn.New(h, contract.NRIPluginName, "10", rt.Socket, conn.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
		runRunner(b, r)
		rt.WaitSynced(b)
		var lat []time.Duration
		for range b.N {
			rt.Stop()
			for r.Ready() == nil {
				time.Sleep(100 * time.Microsecond)
			}
			t0 := time.Now()
			rt.Start(b)
			rt.WaitSynced(b)
			for r.Ready() != nil {
				time.Sleep(100 * time.Microsecond)
			}
			lat = append(lat, time.Since(t0))
		}
		if p50 := median(b, lat); anchorReconnect > 0 {
			b.ReportMetric(float64(p50)/float64(anchorReconnect), "p50/anchor")
		}
	})
}

// TestMain runs the tests, or, as a child of burnCPUs, only spins.
func TestMain(m *testing.M) {
	if os.Getenv(burnEnv) != "" {
		sum := sha256.Sum256(nil)
		for {
			sum = sha256.Sum256(sum[:])
		}
	}
	os.Exit(m.Run())
}
