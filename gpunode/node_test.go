package gpunode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/cdi/simulation/simtest"
	"github.com/nvinject/nvinject/gpunode/nodeconfig"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
	"github.com/nvinject/nvinject/shared/sharing"
)

const nvmlSpec = "sim:a100-80gb*2"

func simUUID(i int) string { return sim.UUID("a100-80gb", i) }

// roots are the simulated driver roots, one per node shape.
var roots simtest.Roots

func TestMain(m *testing.M) { os.Exit(roots.Run(m)) }

// config is the node's settings for a simulated node in a fresh directory,
// as both daemons parse them.
func config(t *testing.T, args ...string) nodeconfig.Config {
	t.Helper()
	dir := t.TempDir()
	cmd := cli.New("test", "[flags]", cli.WithOutput(io.Discard, io.Discard))
	c := nodeconfig.Register(cmd, nodeconfig.Defaults{})
	base := []string{"--nvml=" + nvmlSpec, "--driver-root=" + roots.Get(t, nvmlSpec), "--cdi-spec-dir=" + filepath.Join(dir, "cdi"),
		"--state-dir=" + filepath.Join(dir, "state"), "--metrics-addr=", "--health-quiet-period=1ms", "--pod-resources-socket=", "--node-name=" + testNode}
	if err := cmd.Parse(append(base, args...), nil); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(c.Validate()...); err != nil {
		t.Fatal(err)
	}
	return *c
}

func quietLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// guard wraps the simulated NVML and records every call made while NVML
// is shut down, and a Shutdown that comes while an event wait or a health
// query is still in flight.
type guard struct {
	nvml.Interface
	mu         sync.Mutex
	inflight   int
	shut       int
	waits      int
	violations []string
}

func (g *guard) enter(what string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut > 0 {
		g.violations = append(g.violations, what+" after Shutdown")
	}
	g.inflight++
	if what == "Wait" {
		g.waits++
	}
}

func (g *guard) leave() {
	g.mu.Lock()
	g.inflight--
	g.mu.Unlock()
}

func (g *guard) Shutdown() nvml.Return {
	g.mu.Lock()
	if g.inflight > 0 {
		g.violations = append(g.violations, fmt.Sprintf("Shutdown with %d NVML calls in flight", g.inflight))
	}
	g.shut++
	g.mu.Unlock()
	return g.Interface.Shutdown()
}

func (g *guard) EventSetCreate() (nvml.EventSet, nvml.Return) {
	g.enter("EventSetCreate")
	defer g.leave()
	s, ret := g.Interface.EventSetCreate()
	if ret != nvml.SUCCESS {
		return s, ret
	}
	return &guardSet{EventSet: s, g: g}, ret
}

func (g *guard) DeviceGetHandleByUUID(u string) (nvml.Device, nvml.Return) {
	g.enter("DeviceGetHandleByUUID")
	defer g.leave()
	d, ret := g.Interface.DeviceGetHandleByUUID(u)
	if ret != nvml.SUCCESS {
		return d, ret
	}
	return guardDev{Device: d, g: g}, ret
}

type guardSet struct {
	nvml.EventSet
	g *guard
}

func (s *guardSet) Wait(ms uint32) (nvml.EventData, nvml.Return) {
	s.g.enter("Wait")
	defer s.g.leave()
	return s.EventSet.Wait(ms)
}

func (s *guardSet) Free() nvml.Return {
	s.g.enter("EventSetFree")
	defer s.g.leave()
	return s.EventSet.Free()
}

type guardDev struct {
	nvml.Device
	g *guard
}

func (d guardDev) RegisterEvents(t uint64, s nvml.EventSet) nvml.Return {
	if gs, ok := s.(*guardSet); ok {
		s = gs.EventSet
	}
	return d.Device.RegisterEvents(t, s)
}

func (d guardDev) GetTotalEccErrors(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	d.g.enter("GetTotalEccErrors")
	defer d.g.leave()
	return d.Device.GetTotalEccErrors(t, c)
}

// Shutting down with health events in flight: every goroutine ends, NVML
// is shut down once, after its last event wait and health query returned,
// and never used afterwards, whichever plugin's protocol runs over the
// node. The web server's failure takes the same path.
func TestCleanShutdownWithHealthEventsInFlight(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tt := range []struct {
		name    string
		metrics string
		wantErr string
	}{
		{name: "context cancelled", metrics: ""},
		{name: "metrics address taken", metrics: taken.Addr().String(), wantErr: "listen for metrics"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config(t, "--metrics-addr="+tt.metrics)
			g := &guard{}
			var node *sim.Node
			open := func(v string, _ backend.Options) (*backend.Backend, error) {
				spec, err := sim.ParseSpec(v)
				if err != nil {
					return nil, err
				}
				node = sim.New(spec)
				g.Interface = node.NVML()
				inv, err := nvmlinv.New(g, nvmlinv.WithNodeLookup(node.Nodes()), nvmlinv.WithSimulated(), nvmlinv.WithWaitSlice(5*time.Millisecond))
				if err != nil {
					return nil, err
				}
				return &backend.Backend{Inventory: inv}, nil
			}
			n := New(cfg, quietLog(), WithOpen(open))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			served := make(chan GPUs, 1)
			done := make(chan error, 1)
			go func() {
				done <- n.Run(ctx, func(ctx context.Context, g GPUs) error {
					served <- g
					<-ctx.Done()
					return nil
				})
			}()

			var injectors sync.WaitGroup
			stopInjecting := make(chan struct{})
			if tt.wantErr == "" {
				gpus := <-served
				changed, unsubscribe := gpus.Health.Subscribe()
				defer unsubscribe()
				<-gpus.Health.Monitored()
				for i, xid := range []uint64{48, 13, 79} {
					injectors.Add(1)
					go func() {
						defer injectors.Done()
						uuid := simUUID(i % 2)
						for {
							select {
							case <-stopInjecting:
								return
							default:
							}
							_ = node.InjectXid(uuid, xid)
							_ = gpus.Health.Recover(ctx, uuid)
						}
					}()
				}
				for range 20 {
					<-changed
				}
				cancel()
			}
			select {
			case err := <-done:
				if tt.wantErr == "" && err != nil {
					t.Fatalf("Run = %v", err)
				}
				if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
					t.Fatalf("Run = %v; want %q", err, tt.wantErr)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return within 10s of shutdown")
			}
			close(stopInjecting)
			injectors.Wait()
			g.mu.Lock()
			defer g.mu.Unlock()
			if len(g.violations) > 0 {
				t.Fatalf("NVML lifecycle violations: %v", g.violations)
			}
			if node != nil && g.shut != 1 {
				t.Fatalf("NVML shut down %d times; want once", g.shut)
			}
			if tt.wantErr == "" && g.waits == 0 {
				t.Fatal("no event wait happened; the test proved nothing")
			}
		})
	}
}

// run runs n with serve until the test ends and returns Run's result.
func run(t *testing.T, n *Node, serve Serve) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	result, ended := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(ended)
		result <- n.Run(ctx, serve)
	}()
	t.Cleanup(func() {
		cancel()
		<-ended
	})
	return result
}

// With --hook-binary the node writes the same complete spec as
// nvinject-cdi generate --hook-binary before the protocol starts: the
// library links, CUDA forward compatibility and the ld.so.cache update run
// from that program.
func TestSpecRunsTheHookBinary(t *testing.T) {
	// The spec names the hook by its host path; any executable file will do.
	hook := filepath.Join(t.TempDir(), "nvinject-cdi-hook")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := config(t, "--hook-binary="+hook)
	spec := make(chan []byte, 1)
	run(t, New(cfg, quietLog()), func(ctx context.Context, g GPUs) error {
		b, err := os.ReadFile(filepath.Join(cfg.CDISpecDir, "nvidia.com-gpu.yaml"))
		if err != nil {
			return err
		}
		spec <- b
		<-ctx.Done()
		return nil
	})
	var b []byte
	select {
	case b = <-spec:
	case <-time.After(10 * time.Second):
		t.Fatal("the protocol never started")
	}
	for _, want := range []string{"path: " + hook, "- create-symlinks", "- libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so", "- enable-cuda-compat", "- update-ldcache", simUUID(1)} {
		if !strings.Contains(string(b), want) {
			t.Errorf("CDI spec lacks %q:\n%s", want, b)
		}
	}
}

// --on-nvml-error=wait retries while readiness says why, then serves;
// exit ends Run with the error.
func TestNVMLMissing(t *testing.T) {
	var fails atomic.Int32
	fails.Store(3)
	open := func(v string, o backend.Options) (*backend.Backend, error) {
		if fails.Add(-1) >= 0 {
			return nil, errors.New("libnvidia-ml.so.1 not found")
		}
		return backend.Open(v, o)
	}
	served := make(chan struct{})
	n := New(config(t), quietLog(), WithOpen(open), WithNVMLRetry(20*time.Millisecond))
	done := run(t, n, func(ctx context.Context, _ GPUs) error {
		close(served)
		<-ctx.Done()
		return nil
	})
	if err := n.Ready(); err == nil {
		t.Error("ready before NVML opened")
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(fmt.Sprint(n.Ready()), "libnvidia-ml.so.1 not found"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("readiness never said why NVML is missing: %v", n.Ready())
		}
	}
	select {
	case <-served:
	case err := <-done:
		t.Fatalf("Run ended while NVML was missing: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the protocol never started once NVML opened")
	}
	if err := n.Ready(); err != nil {
		t.Errorf("Ready once NVML opened = %v", err)
	}

	fails.Store(1)
	exit := New(config(t, "--on-nvml-error=exit"), quietLog(), WithOpen(open))
	select {
	case err := <-run(t, exit, func(context.Context, GPUs) error { t.Error("served without NVML"); return nil }):
		if err == nil || !strings.Contains(err.Error(), "cannot open NVML (--nvml="+nvmlSpec+"): libnvidia-ml.so.1 not found") {
			t.Errorf("Run = %v; want the NVML error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept waiting with --on-nvml-error=exit")
	}
}

// The health collectors carry each plugin's names and device IDs: 1 once
// monitoring vouches for a GPU, 0 once Xid 79 takes it off the bus, and
// the Xid counted.
func TestHealthMetrics(t *testing.T) {
	var opened atomic.Pointer[sim.Node]
	open := func(v string, o backend.Options) (*backend.Backend, error) {
		b, node, err := backend.OpenSimulated(v, o)
		opened.Store(node)
		return b, err
	}
	n := New(config(t), quietLog(), WithOpen(open), WithHealthMetrics(HealthMetrics{
		Events: "test_health_events_total", Healthy: "test_device_healthy", HealthyHelp: "health", DeviceLabel: "device",
		DeviceID: func(d gpu.Device) string { return fmt.Sprintf("gpu-%d", d.Index) },
	}))
	run(t, n, func(ctx context.Context, _ GPUs) error {
		<-ctx.Done()
		return nil
	})
	gauge := func(uuid, device string) float64 {
		return testutil.ToFloat64(n.healthy.WithLabelValues(uuid, device))
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	until("both GPUs Healthy", func() bool { return gauge(simUUID(0), "gpu-0") == 1 && gauge(simUUID(1), "gpu-1") == 1 })
	if err := opened.Load().InjectXid(simUUID(1), 79); err != nil {
		t.Fatal(err)
	}
	until("GPU 1 Unhealthy", func() bool { return gauge(simUUID(1), "gpu-1") == 0 })
	if got := testutil.ToFloat64(n.events.WithLabelValues("xid", "79", "false")); got != 1 {
		t.Errorf("Xid 79 counted %v times, want 1", got)
	}
	if c, err := testutil.GatherAndCount(n.reg, "test_device_healthy"); err != nil || c != 2 {
		t.Errorf("test_device_healthy has %d series (%v), want 2", c, err)
	}
}

// WithSharing: the spec records each shared GPU's replicas and the plugin
// gets the configuration.
func TestSharingReachesSpecAndPlugin(t *testing.T) {
	cfg := config(t)
	c, err := sharing.Parse([]byte("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan GPUs, 1)
	run(t, New(cfg, quietLog(), WithSharing(c)), func(ctx context.Context, g GPUs) error {
		got <- g
		<-ctx.Done()
		return nil
	})
	var g GPUs
	select {
	case g = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the protocol never started")
	}
	if rep, ok := g.Sharing.For("nvidia.com/gpu"); !ok || rep.Replicas != 4 {
		t.Errorf("plugin's sharing %+v %v", rep, ok)
	}
	s, err := cdi.ReadSpec(filepath.Join(cfg.CDISpecDir, "nvidia.com-gpu.yaml"), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range s.Devices {
		if d.Name != "all" && d.Annotations[contract.SharedReplicasAnnotation] != "4" {
			t.Errorf("CDI device %s: replicas annotation %q, want 4", d.Name, d.Annotations[contract.SharedReplicasAnnotation])
		}
	}
}

// MPS sharing on a driver root without NVIDIA's MPS binaries ends the node
// with the package to install, before any GPU is published.
func TestMPSWithoutTheControlProgram(t *testing.T) {
	cfg := config(t, "--mps-dir="+t.TempDir())
	c, err := sharing.Parse([]byte("version: v1\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	served := false
	res := run(t, New(cfg, quietLog(), WithSharing(c)), func(ctx context.Context, g GPUs) error {
		served = true
		return nil
	})
	select {
	case err := <-res:
		if err == nil || !strings.Contains(err.Error(), "Debian: nvidia-cuda-mps") || served {
			t.Errorf("Run: %v (served %v), want the missing MPS program named before serving", err, served)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the node ran on without MPS")
	}
}
