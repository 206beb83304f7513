package collect

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/doctor/evidence"
	"github.com/nvinject/nvinject/doctor/promtext"
	"github.com/nvinject/nvinject/shared/contract"
)

const (
	uuid     = "GPU-4f1c7a52-9b7e-4c1d-8a3e-000000000001"
	nodeName = "nvinject-sim-worker"
)

// daemons is an API server with nvinject-nri's pod running on nodeName.
func daemons() *fake.Clientset {
	return fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: contract.NRIApp + "-x1", Namespace: contract.Namespace, Labels: map[string]string{contract.AppLabel: contract.NRIApp}},
		Spec:       corev1.PodSpec{NodeName: nodeName},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5", ContainerStatuses: []corev1.ContainerStatus{{Name: contract.NRIApp, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	})
}

func TestDaemonMetricsFoundFromPod(t *testing.T) {
	d := collectDaemon(context.Background(), daemons(), contract.Namespace, contract.NRIApp, nodeName, contract.NRIMetricsPort)
	if d.MetricsURL != "http://10.0.0.5:9482/metrics" || !d.Running() {
		t.Errorf("got %+v", d)
	}
	d = collectDaemon(context.Background(), daemons(), contract.Namespace, contract.NRIApp, "other-node", contract.NRIMetricsPort)
	if d.Pod != "" || d.Running() || !strings.Contains(d.Describe(), "no nvinject-nri pod") {
		t.Errorf("a pod on another node was taken: %+v", d)
	}
}

// TestHeldGPUsFromMetrics: the device plugin's gpu_held series become
// HeldGPU evidence; a series at 0 is not a holder.
func TestHeldGPUsFromMetrics(t *testing.T) {
	f, err := promtext.Parse(strings.NewReader(`nvinject_device_plugin_gpu_held{uuid="GPU-b",holder="dra-claim",pod="default/vllm",claim="default/vllm-gpu"} 1
nvinject_device_plugin_gpu_held{uuid="GPU-a",holder="unknown",pod="",claim=""} 1
nvinject_device_plugin_gpu_held{uuid="GPU-c",holder="dra-claim",pod="default/old",claim="default/old-gpu"} 0
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []evidence.HeldGPU{{UUID: "GPU-a", Holder: contract.HeldUnknown}, {UUID: "GPU-b", Holder: contract.HeldByDRAClaim, Pod: "default/vllm", Claim: "default/vllm-gpu"}}
	if got := heldGPUs(f); !slices.Equal(got, want) {
		t.Errorf("heldGPUs = %+v, want %+v", got, want)
	}
}

// A GPU with MIG mode on is in the spec as its MIG devices: its UUID counts
// as resolved; a GPU in no spec does not.
func TestCollectCDIMIGParent(t *testing.T) {
	dir := t.TempDir()
	spec := `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: MIG-aaaa
    annotations: {nvinject.io/mig-parent: ` + uuid + `}
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]
`
	if err := os.WriteFile(filepath.Join(dir, "nvidia.com-gpu.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	ev := collectCDI([]string{dir}, []string{"nvidia.com/gpu=" + uuid, "nvidia.com/gpu=GPU-gone"}, "nvidia.com/gpu")
	if !slices.Equal(ev.Unresolved, []string{"nvidia.com/gpu=GPU-gone"}) {
		t.Errorf("unresolved %v (errors %v), want only the GPU in no spec", ev.Unresolved, ev.Errors)
	}
}
