package daemon

import (
	"context"
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
	"github.com/nvinject/nvinject/gpunode/nodemove/nodemovetest"
	"github.com/nvinject/nvinject/shared/contract"
)

// claimPod is a running pod that holds nvinject-dra's device (gpu-<index>)
// through ResourceClaim claim, as kubelet's PodResources lists it.
func claimPod(name, claim, device string) *podresv1.PodResources {
	return &podresv1.PodResources{Namespace: "default", Name: name, Containers: []*podresv1.ContainerResources{{Name: "main",
		DynamicResources: []*podresv1.DynamicResource{{ClaimName: claim, ClaimNamespace: "default", ClaimResources: []*podresv1.ClaimResource{{
			DriverName: contract.DRADriver, PoolName: "node-a", DeviceName: device,
			CdiDevices: []*podresv1.CDIDevice{{Name: "nvidia.com/gpu=" + simUUID(1)}},
		}}}}}}}
}

// untilHealths reads lists until every device has the health want gives it.
func untilHealths(t testing.TB, next func() []*pluginapi.Device, want map[string]string) {
	t.Helper()
	for {
		if maps.Equal(healthOf(next()), want) {
			return
		}
	}
}

func allocateOne(r *rig, id string) error {
	_, err := r.client.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
	return err
}

// TestDRAClaimWithholdsGPU: a GPU a DRA claim's pod holds (the node moved
// back to the device plugin under it) is Unhealthy in kubelet's first list
// and refused by Allocate, naming the claim; once kubelet no longer lists
// the pod it is Healthy again, unless its own health says otherwise.
func TestDRAClaimWithholdsGPU(t *testing.T) {
	for _, tt := range []struct {
		strategy string
		id       func(int) string
	}{
		{"uuid", simUUID},
		{"index", func(i int) string { return []string{"0", "1"}[i] }},
	} {
		t.Run(tt.strategy, func(t *testing.T) {
			pr := nodemovetest.Start(t, filepath.Join(kubelettest.Dir(t), "pr.sock"))
			pr.Set(claimPod("vllm", "vllm-gpu-x7", "gpu-1"))
			r := start(t, "sim:a100-80gb*2", "--device-id-strategy="+tt.strategy, "--pod-resources-socket="+pr.Socket)
			next := r.watch(t)
			held := map[string]string{tt.id(0): pluginapi.Healthy, tt.id(1): pluginapi.Unhealthy}
			if got := healthOf(next()); !maps.Equal(got, held) {
				t.Fatalf("kubelet's first list %v; want %v", got, held)
			}
			err := allocateOne(r, tt.id(1))
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "default/vllm-gpu-x7") || !strings.Contains(err.Error(), "default/vllm/main") {
				t.Errorf("Allocate of the held GPU = %v; want a refusal naming the pod and claim", err)
			}
			untilReady(t, r.d, "a GPU held by DRA is not a readiness problem")
			pr.Set()
			untilHealths(t, next, map[string]string{tt.id(0): pluginapi.Healthy, tt.id(1): pluginapi.Healthy})
			if err := allocateOne(r, tt.id(1)); err != nil {
				t.Errorf("Allocate once the claim's pod ended: %v", err)
			}
		})
	}
}

// TestHeldAndXid: a held GPU that got an Xid meanwhile stays Unhealthy
// when the claim's pod ends.
func TestHeldAndXid(t *testing.T) {
	pr := nodemovetest.Start(t, filepath.Join(kubelettest.Dir(t), "pr.sock"))
	pr.Set(claimPod("vllm", "vllm-gpu-x7", "gpu-1"))
	r := start(t, "sim:a100-80gb*2", "--pod-resources-socket="+pr.Socket)
	next := r.watch(t)
	untilHealths(t, next, map[string]string{simUUID(0): pluginapi.Healthy, simUUID(1): pluginapi.Unhealthy})
	if err := r.sim.InjectXid(simUUID(1), 79); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); r.tracker.Load().Healthy(simUUID(1)); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the tracker never saw Xid 79")
		}
	}
	// The pod moves to the other GPU: the one it held keeps its Xid.
	pr.Set(claimPod("other", "other-gpu", "gpu-0"))
	untilHealths(t, next, map[string]string{simUUID(0): pluginapi.Unhealthy, simUUID(1): pluginapi.Unhealthy})
	if err := allocateOne(r, simUUID(1)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "Unhealthy") {
		t.Errorf("Allocate of the Xid GPU = %v; want the Unhealthy refusal", err)
	}
}

// TestPodResourcesDownWithholdsAll: while kubelet's PodResources cannot be
// read (no socket yet, then List failing) every GPU is Unhealthy and
// readiness says why; once it answers they are Healthy again.
func TestPodResourcesDownWithholdsAll(t *testing.T) {
	sock := filepath.Join(kubelettest.Dir(t), "pr.sock")
	r := start(t, "sim:a100-80gb*2", "--pod-resources-socket="+sock)
	next := r.watch(t)
	down := map[string]string{simUUID(0): pluginapi.Unhealthy, simUUID(1): pluginapi.Unhealthy}
	up := map[string]string{simUUID(0): pluginapi.Healthy, simUUID(1): pluginapi.Healthy}
	if got := healthOf(next()); !maps.Equal(got, down) {
		t.Fatalf("kubelet's first list without PodResources %v; want %v", got, down)
	}
	untilReadiness(t, r.d, "not Ready naming the socket and the fix", func(err error) bool {
		return err != nil && strings.Contains(err.Error(), sock) && strings.Contains(err.Error(), "--pod-resources-socket")
	})
	if err := allocateOne(r, simUUID(0)); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "PodResources") {
		t.Errorf("Allocate while PodResources is down = %v; want a refusal saying why", err)
	}
	pr := nodemovetest.Start(t, sock)
	untilHealths(t, next, up)
	untilReady(t, r.d, "PodResources answers again")
	pr.Fail(status.Error(codes.Unavailable, "kubelet restarting"))
	untilHealths(t, next, down)
	pr.Set()
	untilHealths(t, next, up)
}

// untilReady waits until d is Ready.
func untilReady(t *testing.T, d *Daemon, why string) {
	t.Helper()
	untilReadiness(t, d, "Ready: "+why, func(err error) bool { return err == nil })
}

// untilReadiness waits until d's readiness satisfies ok: the plugin marks
// itself registered when kubelet's Register returns, which may be after
// the fake kubelet saw the request and opened ListAndWatch, so a state
// reached through the stream is not yet the readiness state.
func untilReadiness(t *testing.T, d *Daemon, want string, ok func(error) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := d.Ready()
		if ok(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness 10s on is %v; want %s", err, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
