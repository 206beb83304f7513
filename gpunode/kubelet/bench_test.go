package kubelet

import (
	"context"
	"math/rand/v2"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
)

func report(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	at := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
	b.ReportMetric(at(1), "max-µs")
}

// BenchmarkAnchorRegisterAfterRestart is the anchor for re-registration:
// a test kubelet restarts (kubelet.sock re-created) and a client that
// already knows, and serves the plugin socket again, registers at once over
// the same socket; kubelet dials back in both. The ratio isolates the time
// the plugin takes to notice the restart.
func BenchmarkAnchorRegisterAfterRestart(b *testing.B) {
	dir := kubelettest.Dir(b)
	k := kubelettest.Start(b, dir)
	var lat []time.Duration
	for b.Loop() {
		k = k.Restart(b)
		stop := servePlugin(b, filepath.Join(dir, "p.sock"))
		t0 := time.Now()
		conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		_, err = pluginapi.NewRegistrationClient(conn).Register(context.Background(), &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: "nvidia.com/gpu"})
		_ = conn.Close()
		if err != nil {
			b.Fatal(err)
		}
		k.WaitRegister(b, 10*time.Second)
		lat = append(lat, time.Since(t0))
		k.Stop()
		stop()
	}
	report(b, lat)
}

// servePlugin serves svc on socket until the returned stop.
func servePlugin(b *testing.B, socket string) func() {
	ln, err := net.Listen("unix", socket)
	if err != nil {
		b.Fatal(err)
	}
	srv, done := grpc.NewServer(), make(chan struct{})
	pluginapi.RegisterDevicePluginServer(srv, svc{stop: done})
	go func() { _ = srv.Serve(ln) }()
	return func() { close(done); srv.Stop() }
}

// benchReRegister waits a random part of jitter before each restart, so
// a poll's phase cannot line up with the restarts.
func benchReRegister(b *testing.B, jitter time.Duration, opts ...Option) {
	dir := kubelettest.Dir(b)
	k := kubelettest.Start(b, dir)
	runRegistrar(b, dir, opts...)
	k.WaitRegister(b, 2*time.Second)
	var lat []time.Duration
	for b.Loop() {
		if jitter > 0 {
			time.Sleep(rand.N(jitter))
		}
		k = k.Restart(b)
		t0 := time.Now()
		k.WaitRegister(b, 10*time.Second)
		lat = append(lat, time.Since(t0))
	}
	report(b, lat)
}

// BenchmarkReRegisterWatch is the time from a restarted kubelet's
// kubelet.sock appearing to the plugin's Register reaching it, with the
// directory watch (and the default 1 s poll behind it).
func BenchmarkReRegisterWatch(b *testing.B) { benchReRegister(b, 0) }

// BenchmarkReRegisterPoll10ms is the same with the poll alone, every
// 10 ms, restarts at random phases of it (the fallback polls every
// 100 ms; 10 ms keeps the run short, and the figure scales with it).
func BenchmarkReRegisterPoll10ms(b *testing.B) {
	benchReRegister(b, 10*time.Millisecond, WithoutWatch(), WithPoll(10*time.Millisecond))
}
