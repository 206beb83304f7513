package collect

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/shared/podresources"
)

// TestGPUDevices: each GPU and MIG device of the kind is one device with
// its names, parent, profile, replicas and MPS pipe dir; "all" and another
// kind's devices are none.
func TestGPUDevices(t *testing.T) {
	dir := t.TempDir()
	spec := `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: GPU-aaaa
    annotations: {nvinject.io/gpu-index: "0", nvinject.io/shared-replicas: "4", nvinject.io/mps-pipe-dir: /run/nvinject/mps/gpu-0/pipe}
    containerEdits: {env: [NVINJECT_GPU_UUID_0=GPU-aaaa], deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
  - name: "0"
    annotations: {nvinject.io/gpu-index: "0", nvinject.io/shared-replicas: "4", nvinject.io/mps-pipe-dir: /run/nvinject/mps/gpu-0/pipe}
    containerEdits: {env: [NVINJECT_GPU_UUID_0=GPU-aaaa], deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
  - name: MIG-bbbb
    annotations: {nvinject.io/mig-parent: GPU-cccc, nvinject.io/mig-profile: 1g.10gb}
    containerEdits: {env: [NVINJECT_MIG_UUID_12=MIG-bbbb], deviceNodes: [{path: /dev/nvidia1, type: c, major: 195, minor: 1}]}
  - name: all
    containerEdits: {env: [NVINJECT_GPU_UUID_0=GPU-aaaa, NVINJECT_MIG_UUID_12=MIG-bbbb], deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]}
`
	other := "cdiVersion: \"0.6.0\"\nkind: example.com/nic\ndevices:\n  - name: GPU-dddd\n    containerEdits: {env: [NVINJECT_GPU_UUID_9=GPU-dddd], deviceNodes: [{path: /dev/null}]}\n"
	for name, s := range map[string]string{"nvidia.com-gpu.yaml": spec, "example.com-nic.yaml": other} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ev := collectCDI([]string{dir}, nil, "nvidia.com/gpu")
	want := []evidence.CDIDevice{
		{UUID: "GPU-aaaa", Names: []string{"0", "GPU-aaaa"}, Replicas: 4, MPS: &evidence.MPSDaemon{PipeDir: "/run/nvinject/mps/gpu-0/pipe"}},
		{UUID: "MIG-bbbb", Names: []string{"MIG-bbbb"}, Parent: "GPU-cccc", Profile: "1g.10gb"},
	}
	if !reflect.DeepEqual(ev.GPUDevices, want) {
		t.Errorf("GPUDevices = %+v (errors %v), want %+v", ev.GPUDevices, ev.Errors, want)
	}
}

// TestDialMPS: a listening control socket is up; a stale socket file (its
// daemon gone) and a missing one are down.
func TestDialMPS(t *testing.T) {
	up, stale, missing := t.TempDir(), t.TempDir(), t.TempDir()
	l, err := net.Listen("unixpacket", filepath.Join(up, "control"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err := net.Listen("unixpacket", filepath.Join(stale, "control"))
	if err != nil {
		t.Fatal(err)
	}
	s.(*net.UnixListener).SetUnlinkOnClose(false)
	s.Close()
	devs := []evidence.CDIDevice{{UUID: "GPU-up", MPS: &evidence.MPSDaemon{PipeDir: up}}, {UUID: "GPU-stale", MPS: &evidence.MPSDaemon{PipeDir: stale}},
		{UUID: "GPU-missing", MPS: &evidence.MPSDaemon{PipeDir: missing}}, {UUID: "GPU-no-mps"}}
	dialMPS(devs)
	for _, tc := range []struct {
		i    int
		down string
	}{{0, ""}, {1, "connection refused"}, {2, "no such file or directory"}} {
		if m := devs[tc.i].MPS; (tc.down == "") != (m.Down == "") || !strings.Contains(m.Down, tc.down) || m.Unread != "" {
			t.Errorf("%s: MPS %+v, want down %q", devs[tc.i].UUID, m, tc.down)
		}
	}
	if devs[3].MPS != nil {
		t.Errorf("a device without MPS got %+v", devs[3].MPS)
	}
}

// lister answers List with resp or err.
type lister struct {
	resp *podresv1.ListPodResourcesResponse
	err  error
}

func (l lister) List(context.Context, *podresv1.ListPodResourcesRequest, ...grpc.CallOption) (*podresv1.ListPodResourcesResponse, error) {
	return l.resp, l.err
}

func TestListPodResources(t *testing.T) {
	resp := &podresv1.ListPodResourcesResponse{PodResources: []*podresv1.PodResources{
		{Namespace: "default", Name: "b", Containers: []*podresv1.ContainerResources{{Name: "c", Devices: []*podresv1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-aaaa::1"}}, {ResourceName: "example.com/nic", DeviceIds: nil}}}}},
		{Namespace: "default", Name: "a", Containers: []*podresv1.ContainerResources{{Name: "c", Devices: []*podresv1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-aaaa::0"}}}}}},
	}}
	got := listPodResources(context.Background(), podresources.New(lister{resp: resp}), evidence.PodResourcesEvidence{Socket: "s"})
	want := evidence.PodResourcesEvidence{Socket: "s", Containers: []evidence.ContainerDevices{
		{PodRef: evidence.PodRef{Namespace: "default", Name: "a", Container: "c"}, Resource: "nvidia.com/gpu", IDs: []string{"GPU-aaaa::0"}},
		{PodRef: evidence.PodRef{Namespace: "default", Name: "b", Container: "c"}, Resource: "nvidia.com/gpu", IDs: []string{"GPU-aaaa::1"}},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("listPodResources = %+v, want %+v", got, want)
	}
	got = listPodResources(context.Background(), podresources.New(lister{err: errors.New("permission denied")}), evidence.PodResourcesEvidence{Socket: "s"})
	if !strings.Contains(got.Unread, "permission denied") || !strings.Contains(got.Unread, "--pod-resources-socket") {
		t.Errorf("unread %q", got.Unread)
	}
}

// TestCollectPodResourcesNoSocket: a socket that is not there is unread,
// not an empty node.
func TestCollectPodResourcesNoSocket(t *testing.T) {
	got := collectPodResources(context.Background(), filepath.Join(t.TempDir(), "kubelet.sock"))
	if got.Unread == "" {
		t.Errorf("no socket read as %+v", got)
	}
}

func TestMIGStrategy(t *testing.T) {
	pod := func(c corev1.Container) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
	}
	for _, tc := range []struct {
		name, app string
		c         corev1.Container
		want      string
	}{
		{"env", "single-gpu-device-plugin", corev1.Container{Env: []corev1.EnvVar{{Name: "MIG_STRATEGY", Value: "mixed"}}}, "mixed"},
		{"flag wins", "single-gpu-device-plugin", corev1.Container{Args: []string{"--mig-strategy", "single"}, Env: []corev1.EnvVar{{Name: "MIG_STRATEGY", Value: "mixed"}}}, "single"},
		{"flag=", "nvinject-dra", corev1.Container{Args: []string{"--mig-strategy=none"}}, "none"},
		{"from a ConfigMap", "single-gpu-device-plugin", corev1.Container{Env: []corev1.EnvVar{{Name: "MIG_STRATEGY", ValueFrom: &corev1.EnvVarSource{}}}}, ""},
		{"device plugin default", "single-gpu-device-plugin", corev1.Container{}, "none"},
		{"nvinject-dra default", "nvinject-dra", corev1.Container{}, "mixed"},
	} {
		if got := migStrategy(pod(tc.c), tc.app); got != tc.want {
			t.Errorf("%s: migStrategy = %q, want %q", tc.name, got, tc.want)
		}
	}
}
