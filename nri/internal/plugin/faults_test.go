package plugin_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	validator "github.com/containerd/nri/plugins/default-validator/builtin"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/shared/contract"
)

// foreign is a second NRI plugin at a higher index (it runs after
// nvinject) that hands every container another GPU.
type foreign struct {
	adjust func(*api.ContainerAdjustment)
}

func (f foreign) CreateContainer(_ context.Context, _ *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	f.adjust(adj)
	return adj, nil, nil
}

func connectForeign(t *testing.T, rt *nritest.Runtime, f foreign) {
	t.Helper()
	s, err := stub.New(f, stub.WithPluginName("foreign-gpu"), stub.WithPluginIdx("90"), stub.WithSocketPath(rt.Socket))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(); cancel() })
	rt.WaitSynced(t)
}

func gpuNode(minor int64) *api.LinuxDevice {
	return &api.LinuxDevice{Path: fmt.Sprintf("/dev/nvidia%d", minor), Type: "c", Major: 195, Minor: minor}
}

// TestForeignGPUFromALaterPluginIsRefused: nvinject checks the container
// after every plugin's adjustment, so a GPU that a plugin running after it
// adds, as a node, a bind mount or a device cgroup rule, refuses the
// container, GPU pod or not.
func TestForeignGPUFromALaterPluginIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		adjust func(*api.ContainerAdjustment)
		want   string
	}{
		{"device node 195:1", func(a *api.ContainerAdjustment) { a.AddDevice(gpuNode(1)) }, "/dev/nvidia1"},
		{"node 195:1 at another path", func(a *api.ContainerAdjustment) {
			a.AddDevice(&api.LinuxDevice{Path: "/dev/accel", Type: "c", Major: 195, Minor: 1})
		}, "/dev/nvidia1"},
		{"bind mount of /dev/nvidia1", func(a *api.ContainerAdjustment) {
			a.AddMount(&api.Mount{Source: "/dev/nvidia1", Destination: "/dev/nvidia1", Type: "bind", Options: []string{"bind"}})
		}, "/dev/nvidia1"},
		{"device cgroup rule 195:1", func(a *api.ContainerAdjustment) {
			a.Linux = &api.LinuxContainerAdjustment{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
				{Allow: true, Type: "c", Major: api.Int64(195), Minor: api.Int64(1), Access: "rw"}}}}
		}, "/dev/nvidia1"},
		{"device cgroup rule for every GPU", func(a *api.ContainerAdjustment) {
			a.Linux = &api.LinuxContainerAdjustment{Resources: &api.LinuxResources{Devices: []*api.LinuxDeviceCgroup{
				{Allow: true, Type: "c", Major: api.Int64(195), Access: "rwm"}}}}
		}, "grants every GPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := start(t, envOpts{})
			connectForeign(t, e.rt, foreign{tc.adjust})
			_, _, err := e.create(t, nritest.Pod("g", "nvidia", nil), map[string]string{contract.DevicesAnnotation: e.node.Name(0)}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "10-nvinject") {
				t.Fatalf("GPU pod: err = %v, want nvinject's validator refusing %s", err, tc.want)
			}
			_, _, err = e.create(t, nritest.Pod("r", "", nil), nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("non-GPU pod: err = %v, want a refusal naming %s", err, tc.want)
			}
			if got := refusals(t, e.reg, "foreign-gpu"); got != 2 {
				t.Errorf("refusals{foreign-gpu} = %v, want 2", got)
			}
		})
	}
	t.Run("a later plugin adding nothing GPU-related", func(t *testing.T) {
		e := start(t, envOpts{})
		connectForeign(t, e.rt, foreign{func(a *api.ContainerAdjustment) { a.AddEnv("OTHER", "1") }})
		s, _, err := e.create(t, nritest.Pod("g", "nvidia", nil), map[string]string{contract.DevicesAnnotation: e.node.Name(0)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := envOf(s, "OTHER"); v != "1" {
			t.Error("the other plugin's adjustment was lost")
		}
	})
}

// startWith is start with the runtime's default validator and request
// timeout as containerd's config sets them, the handler's deadline, and
// the handler wrapped in the simulation's delay.
func startWith(t *testing.T, timeout time.Duration, opts ...plugin.Option) *env {
	t.Helper()
	nritest.RequestTimeout(t, timeout)
	return start(t, envOpts{runtimeOpts: []adaptation.Option{adaptation.WithDefaultValidator(&validator.DefaultValidatorConfig{Enable: true})}, handlerOpts: opts, slow: true})
}

var requireNvinject = map[string]string{contract.RequiredPluginsAnnotation: `["` + contract.NRIPluginName + `"]`}

// TestSlowPlugin: a CreateContainer slower than --request-deadline is
// refused by the plugin itself, before containerd's plugin_request_timeout
// could skip it; one within the deadline passes.
func TestSlowPlugin(t *testing.T) {
	e := startWith(t, 2*time.Second, plugin.WithRequestDeadline(300*time.Millisecond))
	ann := map[string]string{contract.DevicesAnnotation: e.node.Name(0)}
	e.slow.SetDelay(100 * time.Millisecond)
	if _, _, err := e.create(t, nritest.Pod("a", "nvidia", requireNvinject), ann, nil); err != nil {
		t.Fatalf("slow within the deadline: %v", err)
	}
	e.slow.SetDelay(5 * time.Second)
	t0 := time.Now()
	_, _, err := e.create(t, nritest.Pod("b", "nvidia", requireNvinject), ann, nil)
	took := time.Since(t0)
	if err == nil || !strings.Contains(err.Error(), "--request-deadline=300ms") {
		t.Fatalf("slow past the deadline: err = %v, want nvinject's deadline refusal", err)
	}
	if took > time.Second {
		t.Errorf("refusal took %s; the deadline is 300ms", took)
	}
	if got := refusals(t, e.reg, plugin.ReasonDeadline); got != 1 {
		t.Errorf("refusals{deadline} = %v, want 1", got)
	}
	t.Logf("CreateContainer 5s slow: refused after %s (deadline 300ms, runtime timeout 2s)", took.Round(time.Millisecond))
}

// TestRuntimeTimeoutBelowTheDeadline: the runtime sends its request
// timeout with each call, so a plugin_request_timeout set below
// --request-deadline still ends in nvinject's refusal, not a skip.
func TestRuntimeTimeoutBelowTheDeadline(t *testing.T) {
	e := startWith(t, 400*time.Millisecond, plugin.WithRequestDeadline(10*time.Second))
	e.slow.SetDelay(time.Hour)
	_, _, err := e.create(t, nritest.Pod("a", "nvidia", requireNvinject), map[string]string{contract.DevicesAnnotation: e.node.Name(0)}, nil)
	if err == nil || !strings.Contains(err.Error(), "runtime's request timeout") {
		t.Fatalf("err = %v, want nvinject's refusal at 3/4 of the runtime's timeout", err)
	}
	if got := refusals(t, e.reg, plugin.ReasonDeadline); got != 1 {
		t.Errorf("refusals{deadline} = %v, want 1", got)
	}
}

// TestDisconnectedPlugin: while nvinject is not connected, a pod requiring
// it is refused by containerd's default validator and a pod that does not
// starts.
func TestDisconnectedPlugin(t *testing.T) {
	e := startWith(t, 2*time.Second)
	waitFor(t, func() bool { return e.runner.Ready() == nil })
	if err := e.runner.Reconnect(time.Hour); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return e.runner.Ready() != nil })
	var err error
	// The first call after the drop may still list the closed plugin; its
	// validation then fails the call whatever the pod.
	for range 2 {
		if _, _, err = e.create(t, nritest.Pod("r", "", nil), nil, nil); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("non-GPU pod while nvinject is away: %v", err)
	}
	_, _, err = e.create(t, nritest.Pod("g", "nvidia", requireNvinject), map[string]string{contract.DevicesAnnotation: e.node.Name(0)}, nil)
	if err == nil || !strings.Contains(err.Error(), `required plugin "nvinject" not present`) {
		t.Fatalf("GPU pod while nvinject is away: err = %v, want the default validator's refusal", err)
	}
	if strings.Contains(err.Error(), "nvinject: ") {
		t.Errorf("refusal came from nvinject although it is disconnected: %v", err)
	}
}
