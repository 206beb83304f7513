package doctor

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

const (
	nodeName   = "nvinject-sim-worker"
	pluginText = `nvinject_device_plugin_registrations_total{result="ok"} 1
nvinject_device_plugin_list_and_watch_streams 1
nvinject_device_plugin_device_healthy{uuid="` + uuid + `",device_id="` + uuid + `"} 1
nvinject_device_plugin_health_events_total{kind="xid",xid="13",ignored="true"} 2
nvinject_device_plugin_allocations_total{result="ok"} 1
`
	nriText  = "nvinject_nri_connected 1\nnvinject_nri_refusals_total{reason=\"unresolvable\"} 0\n"
	cdiSpec  = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: " + uuid + "\n  containerEdits:\n    deviceNodes:\n    - {path: /dev/nvidia0, type: c, major: 195, minor: 0}\n"
	ctrdConf = "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  cdi_spec_dirs = ['CDIDIR']\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n  runtime_type = 'io.containerd.runc.v2'\n"
)

// node is a simulated worker's files, sockets and daemons.
type node struct{ opts Options }

func newNode(t *testing.T) node {
	t.Helper()
	dir := t.TempDir()
	kubelet, cdiDir := filepath.Join(dir, "dp"), filepath.Join(dir, "cdi")
	for _, d := range []string{kubelet, cdiDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"kubelet.sock", "nvinject-gpu.sock"} {
		l, err := net.Listen("unix", filepath.Join(kubelet, s))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	write := func(p, s string, mode os.FileMode) {
		if err := os.WriteFile(p, []byte(s), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(cdiDir, "nvidia.com-gpu.yaml"), cdiSpec, 0o644)
	conf := filepath.Join(dir, "config.toml")
	write(conf, strings.ReplaceAll(ctrdConf, "CDIDIR", cdiDir), 0o644)
	smiPath := filepath.Join(dir, "nvidia-smi")
	write(smiPath, "#!/bin/sh\necho '0, "+uuid+", NVIDIA A100-SXM4-80GB [SIMULATED], Disabled'\n", 0o755)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/plugin":
			_, _ = w.Write([]byte(pluginText))
		case "/nri":
			_, _ = w.Write([]byte(nriText))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return node{opts: Options{
		KubeletDir: kubelet, CDISpecDirs: []string{cdiDir}, ContainerdConfig: conf, NvidiaSMI: smiPath,
		DevicePluginMetrics: srv.URL + "/plugin", NRIMetrics: srv.URL + "/nri", HTTPClient: srv.Client(),
	}}
}

func gpuPod(name, node string, phase corev1.PodPhase) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "vllm-demo"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
	if phase == corev1.PodRunning {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	}
	return p
}

func cluster(selected string, extra ...runtime.Object) *fake.Clientset {
	one := resource.MustParse("1")
	objs := []runtime.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}, Status: corev1.NodeStatus{
			Capacity: corev1.ResourceList{"nvidia.com/gpu": one}, Allocatable: corev1.ResourceList{"nvidia.com/gpu": one}}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "single-gpu-device-plugin", Namespace: "nvidia-device-plugin"},
			Data: map[string]string{"selected-gpu-uuid": selected}},
		&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "nvidia"},
		gpuPod("vllm-demo-1", nodeName, corev1.PodRunning),
	}
	return fake.NewClientset(append(objs, extra...)...)
}

func TestRun(t *testing.T) {
	pending := gpuPod("second", "", corev1.PodPending)
	pending.Labels = nil
	pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
		Message: "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."}}
	tests := []struct {
		name     string
		client   *fake.Clientset
		noKube   bool
		remote   bool
		want     map[Layer]Status
		evidence map[Layer]string
	}{
		{name: "healthy", client: cluster(uuid),
			want: map[Layer]Status{LayerDriver: OK, LayerRegistration: OK, LayerHealth: OK, LayerScheduling: OK, LayerAllocate: OK, LayerCDIRuntime: OK, LayerApplication: OK}},
		{name: "GPU taken", client: cluster(uuid, pending),
			want:     map[Layer]Status{LayerScheduling: Broken, LayerCDIRuntime: OK},
			evidence: map[Layer]string{LayerScheduling: "default/second Pending: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu"}},
		{name: "selected GPU has no CDI device", client: cluster("GPU-ffffffff-0000-0000-0000-000000000000"),
			want:     map[Layer]Status{LayerDriver: Broken, LayerCDIRuntime: Broken},
			evidence: map[Layer]string{LayerCDIRuntime: "nvidia.com/gpu=GPU-ffffffff-0000-0000-0000-000000000000 resolves to no device"}},
		{name: "node only", noKube: true,
			want: map[Layer]Status{LayerDriver: OK, LayerRegistration: Unknown, LayerHealth: OK, LayerScheduling: Unknown, LayerAllocate: Unknown, LayerCDIRuntime: Unknown, LayerApplication: Unknown}},
		{name: "remote", client: cluster(uuid), remote: true,
			want: map[Layer]Status{LayerDriver: Unknown, LayerRegistration: OK, LayerHealth: OK, LayerScheduling: OK, LayerAllocate: OK, LayerCDIRuntime: Unknown, LayerApplication: OK}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newNode(t).opts
			o.Node, o.NoKube, o.Remote = nodeName, tt.noKube, tt.remote
			if tt.client != nil {
				o.Client = tt.client
			}
			r, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			for layer, want := range tt.want {
				v, _ := r.Verdict(layer)
				if v.Status != want || !strings.Contains(strings.Join(v.Evidence, "\n"), tt.evidence[layer]) {
					t.Errorf("%s = %s, want %s with %q\n%s", layer, v.Status, want, tt.evidence[layer], strings.Join(v.Evidence, "\n"))
				}
			}
		})
	}
}
