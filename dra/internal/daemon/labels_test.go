package daemon

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// nvinject-dra publishes the same GPU labels on its Node as the device
// plugin would (the one publisher in gpunode), under its MIG strategy.
func TestNodeLabels(t *testing.T) {
	r := newRig(t, "sim:a100-80gb*2,mig=1:3g.40gb*2,driver=535.261.03")
	want := map[string]string{contract.GFDLabelProduct: "NVIDIA-A100-SXM4-80GB", contract.GFDLabelCount: "2",
		contract.GFDLabelDriverVersion: "535.261.03", contract.GFDLabelCUDAVersion: "12.2", contract.GFDLabelMIGCapable: "true",
		contract.GFDLabelMIGStrategy: "mixed", "nvidia.com/mig-3g.40gb.count": "2"}
	var got map[string]string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n, err := r.client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
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
