package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/deviceplugin/internal/kubelettest"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

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
// and never used afterwards. The web server's failure takes the same path.
func TestCleanShutdownWithHealthEventsInFlight(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tests := []struct {
		name    string
		metrics string
		wantErr string
	}{
		{name: "context cancelled", metrics: ""},
		{name: "metrics address taken", metrics: taken.Addr().String(), wantErr: "listen for metrics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := kubelettest.Dir(t)
			k := kubelettest.Start(t, dir)
			nvmlSpec := "sim:a100-80gb*2"
			cfg, err := config.Load([]string{"--nvml=" + nvmlSpec, "--kubelet-dir=" + dir, "--cdi-spec-dir=" + filepath.Join(dir, "cdi"),
				"--state-dir=" + filepath.Join(dir, "state"), "--driver-root=" + driverRoot(t, nvmlSpec),
				"--metrics-addr=" + tt.metrics, "--health-quiet-period=1ms", "--pod-resources-socket="}, func(string) string { return "" }, io.Discard, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			g := &guard{}
			var node *sim.Node
			opened := make(chan struct{})
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
				close(opened)
				return &backend.Backend{Inventory: inv, Sim: node}, nil
			}
			d := New(cfg, quietLog(), WithOpen(open), WithTimings(10*time.Millisecond, 10*time.Second, 10*time.Millisecond))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()

			var injectors sync.WaitGroup
			stopInjecting := make(chan struct{})
			if tt.wantErr == "" {
				req := k.WaitRegister(t, 10*time.Second)
				client := kubelettest.Dial(t, dir, req.Endpoint)
				stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
				if err != nil {
					t.Fatal(err)
				}
				<-opened
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
							_ = d.late().Recover(ctx, uuid)
						}
					}()
				}
				for range 20 {
					if _, err := stream.Recv(); err != nil {
						t.Fatalf("ListAndWatch before shutdown: %v", err)
					}
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
