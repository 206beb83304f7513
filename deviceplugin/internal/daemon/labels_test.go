package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvinject/nvinject/gpunode/nodelabels/typednodes"
	"github.com/nvinject/nvinject/shared/contract"
)

// With --node-labels the plugin publishes GFD's labels on its Node; the
// kubelet protocol registers as without them.
func TestNodeLabels(t *testing.T) {
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1"}})
	r := newRig(t, map[string]string{"nvidia.com/gpu": "nvinject-gpu.sock"}, "sim:a100-80gb*2,driver=535.261.03", "--node-labels", "--node-name=gpu-node-1")
	r.run(t, WithNodes(typednodes.New(c.CoreV1().Nodes())))
	want := map[string]string{contract.GFDLabelProduct: "NVIDIA-A100-SXM4-80GB", contract.GFDLabelCount: "2", contract.GFDLabelMemory: "81920",
		contract.GFDLabelDriverVersion: "535.261.03", contract.GFDLabelCUDAVersion: "12.2", contract.GFDLabelMIGCapable: "true"}
	var got map[string]string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-node-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got = n.Labels; got[contract.GFDLabelCount] != "" {
			break
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("label %s = %q, want %q (labels %v)", k, got[k], v, got)
		}
	}
}

// Publishing needs an API server: out of a cluster and without
// --kubeconfig the plugin says so and names --node-labels=false.
func TestNodeLabelsWithoutAPIServer(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	r := newRig(t, nil, "sim:a100-80gb", "--node-labels", "--node-name=gpu-node-1")
	err := New(r.cfg, quietLog()).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "--node-labels=false") || !strings.Contains(err.Error(), "give a kubeconfig") {
		t.Fatalf("Run = %v; want the API configuration's error and --node-labels=false", err)
	}
}
