package daemon

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/deviceplugin/internal/config"
	"github.com/nvinject/nvinject/gpunode"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

const mixedNode = "sim:a100-80gb*2,mig=1:3g.40gb+1g.10gb*2"

var mixedResources = map[string]string{
	"nvidia.com/gpu":         "nvinject-gpu.sock",
	"nvidia.com/mig-1g.10gb": "nvinject-gpu-mig-1g.10gb.sock",
	"nvidia.com/mig-3g.40gb": "nvinject-gpu-mig-3g.40gb.sock",
}

func allocateIDs(t testing.TB, client pluginapi.DevicePluginClient, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	t.Helper()
	resp, err := client.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}})
	if err != nil {
		return nil, err
	}
	return resp.ContainerResponses[0], nil
}

func cdiNames(c *pluginapi.ContainerAllocateResponse) []string {
	var out []string
	for _, d := range c.GetCdiDevices() {
		out = append(out, d.GetName())
	}
	return out
}

// MIG_STRATEGY=mixed: the whole GPU under nvidia.com/gpu and each MIG
// profile under its own resource and socket; a MIG device allocates to its
// own CDI device; an Xid on the parent turns its slices Unhealthy only.
func TestMIGMixedPublishesAResourcePerProfile(t *testing.T) {
	r := startExpecting(t, mixedResources, mixedNode, "--mig-strategy=mixed", "--visible-devices=all")
	whole := watchClient(t, r.clients["nvidia.com/gpu"])
	small := watchClient(t, r.clients["nvidia.com/mig-1g.10gb"])
	big := watchClient(t, r.clients["nvidia.com/mig-3g.40gb"])
	if l := untilHealth(t, whole, simUUID(0), pluginapi.Healthy); len(l) != 1 {
		t.Fatalf("nvidia.com/gpu publishes %v, want GPU 0 only", l)
	}
	smallList, bigList := small(), big()
	if len(smallList) != 2 || len(bigList) != 1 {
		t.Fatalf("1g.10gb publishes %v; want 2 (and one 3g.40gb)", smallList)
	}
	for _, d := range smallList {
		if !strings.HasPrefix(d.ID, "MIG-") || d.Health != pluginapi.Healthy {
			t.Errorf("MIG device %v: want a Healthy MIG UUID", d)
		}
	}
	id := smallList[1].ID
	c, err := allocateIDs(t, r.clients["nvidia.com/mig-1g.10gb"], id)
	if err != nil {
		t.Fatal(err)
	}
	if got := cdiNames(c); !slices.Equal(got, []string{"nvidia.com/gpu=" + id}) {
		t.Errorf("Allocate %s gives %v, want its own CDI device", id, got)
	}
	spec, err := os.ReadFile(filepath.Join(r.dir, "cdi", "nvidia.com-gpu.yaml"))
	if err != nil || !strings.Contains(string(spec), "name: "+id) || strings.Contains(string(spec), "name: "+simUUID(1)) {
		t.Errorf("CDI spec (%v) lacks MIG device %s or holds the MIG GPU whole", err, id)
	}

	if err := r.sim.InjectXid(simUUID(1), 79); err != nil {
		t.Fatal(err)
	}
	if h := healthOf(untilHealth(t, small, smallList[0].ID, pluginapi.Unhealthy)); h[smallList[0].ID] != pluginapi.Unhealthy || h[id] != pluginapi.Unhealthy {
		t.Errorf("1g.10gb after an Xid on the parent: %v, want both Unhealthy", h)
	}
	untilHealth(t, big, bigList[0].ID, pluginapi.Unhealthy)
	if h := healthOf(r.kubelet.Devices(mixedResources["nvidia.com/gpu"])); h[simUUID(0)] != pluginapi.Healthy {
		t.Errorf("GPU 0 after an Xid on GPU 1: %v", h)
	}
	if _, err := allocateIDs(t, r.clients["nvidia.com/mig-1g.10gb"], id); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("Allocate of a slice of an Xid'ed GPU: %v, want refused", err)
	}
}

// MIG_STRATEGY=single: fourteen 1g.10gb MIG devices of two GPUs are the
// node's nvidia.com/gpu; DEVICE_ID_STRATEGY=index names them NVIDIA's way.
func TestMIGSinglePublishesMIGDevicesAsTheGPUResource(t *testing.T) {
	r := start(t, "sim:a100-80gb*2,mig=0+1:1g.10gb*7", "--mig-strategy=single", "--visible-devices=all", "--device-id-strategy=index")
	list := r.watch(t)()
	var ids []string
	for _, d := range list {
		ids = append(ids, d.ID)
	}
	if len(ids) != 14 || ids[0] != "0:0" || ids[13] != "1:6" {
		t.Fatalf("single strategy publishes %v, want 0:0..1:6", ids)
	}
	c, err := allocateIDs(t, r.client, "1:6")
	if err != nil {
		t.Fatal(err)
	}
	if got := cdiNames(c); len(got) != 1 || !strings.HasPrefix(got[0], "nvidia.com/gpu=MIG-") {
		t.Errorf("Allocate 1:6 gives %v, want one MIG device", got)
	}
}

// runErr runs a daemon for args until it returns, failing after timeout.
func runErr(t *testing.T, nvml string, args ...string) error {
	t.Helper()
	dir := t.TempDir()
	base := []string{"--nvml=" + nvml, "--kubelet-dir=" + dir, "--cdi-spec-dir=" + filepath.Join(dir, "cdi"), "--state-dir=",
		"--driver-root=" + driverRoot(t, nvml), "--metrics-addr=", "--pod-resources-socket=", "--node-labels=false"}
	cfg, err := config.Load(append(base, args...), func(string) string { return "" }, io.Discard, io.Discard)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open := func(v string, o backend.Options) (*backend.Backend, error) {
		b, _, err := backend.OpenSimulated(v, o)
		return b, err
	}
	return New(cfg, quietLog(), WithNode(gpunode.WithOpen(open))).Run(ctx)
}

func TestMIGRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, nvml string
		args       []string
		want       string
	}{
		{"single on a node mixing MIG on and off", mixedNode, []string{"--mig-strategy=single", "--visible-devices=all"}, "MIG_STRATEGY=single needs MIG mode on every selected GPU"},
		{"single with two profiles", "sim:a100-80gb,mig=0:3g.40gb+1g.10gb", []string{"--mig-strategy=single", "--visible-devices=all"}, "needs one MIG profile"},
		{"none naming a MIG GPU", mixedNode, []string{"--mig-strategy=none", "--visible-devices=1"}, "nvidia-smi -i 1 -mig 0"},
		{"mixed with MIG on but no MIG device", "sim:a100-80gb,mig=0", []string{"--mig-strategy=mixed", "--visible-devices=all"}, "without MIG devices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := runErr(t, tc.nvml, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func writeSharing(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sharing.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Time-slicing: each GPU is four replicas of the renamed resource; two
// replicas of one GPU are one CDI device; the spec records the replicas;
// failRequestsGreaterThanOne refuses a container asking for two.
func TestTimeSlicingPublishesReplicas(t *testing.T) {
	cfg := writeSharing(t, "version: v1\nsharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - {name: nvidia.com/gpu, replicas: 4}\n")
	r := startExpecting(t, map[string]string{"nvidia.com/gpu.shared": "nvinject-gpu.sock"}, "sim:a100-80gb*2", "--visible-devices=all", "--sharing-config="+cfg)
	list := r.watch(t)()
	if len(list) != 8 || list[0].ID != simUUID(0)+"::0" || list[7].ID != simUUID(1)+"::3" {
		t.Fatalf("replicas %v, want 4 of each GPU", list)
	}
	c, err := allocateIDs(t, r.client, simUUID(0)+"::1", simUUID(0)+"::2")
	if err != nil {
		t.Fatal(err)
	}
	if got := cdiNames(c); !slices.Equal(got, []string{"nvidia.com/gpu=" + simUUID(0)}) {
		t.Errorf("two replicas of GPU 0 give %v, want its one CDI device", got)
	}
	if pref, err := r.client.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{simUUID(0) + "::0", simUUID(0) + "::1", simUUID(1) + "::0"}, AllocationSize: 2}}}); err != nil || len(pref.ContainerResponses[0].DeviceIDs) != 2 ||
		strings.Split(pref.ContainerResponses[0].DeviceIDs[0], "::")[0] == strings.Split(pref.ContainerResponses[0].DeviceIDs[1], "::")[0] {
		t.Errorf("preferred 2 of 3 replicas: %v %v, want two GPUs", pref, err)
	}
	spec, err := os.ReadFile(filepath.Join(r.dir, "cdi", "nvidia.com-gpu.yaml"))
	if err != nil || strings.Count(string(spec), "nvinject.io/shared-replicas: \"4\"") != 2 {
		t.Errorf("CDI spec (%v) does not record 4 replicas on both GPUs:\n%s", err, spec)
	}
}

func TestTimeSlicingOneReplicaPerContainer(t *testing.T) {
	cfg := writeSharing(t, "version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: true\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n")
	r := start(t, "sim:a100-80gb*2", "--visible-devices=all", "--sharing-config="+cfg)
	if _, err := allocateIDs(t, r.client, simUUID(0)+"::0", simUUID(1)+"::0"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "failRequestsGreaterThanOne") {
		t.Errorf("two replicas with failRequestsGreaterThanOne: %v", err)
	}
	if _, err := allocateIDs(t, r.client, simUUID(1)+"::1"); err != nil {
		t.Errorf("one replica: %v", err)
	}
}

func TestSharingConfigRefused(t *testing.T) {
	cfg := writeSharing(t, "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 1}\n")
	_, err := config.Load([]string{"--node-labels=false", "--sharing-config=" + cfg}, func(string) string { return "" }, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "1 shares nothing") || !strings.Contains(err.Error(), cfg) {
		t.Errorf("bad sharing config: %v", err)
	}
	if _, err := config.Load([]string{"--node-labels=false", "--sharing-config=" + filepath.Join(t.TempDir(), "absent.yaml")}, func(string) string { return "" }, io.Discard, io.Discard); err != nil {
		t.Errorf("absent sharing file (its ConfigMap is optional): %v", err)
	}
}
