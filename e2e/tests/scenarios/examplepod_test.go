package scenarios

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// The example GPU pod as written (RuntimeClass nvidia, nvidia.com/gpu: 1, no
// annotation) is admitted with the required-plugins annotation, runs with
// the selected GPU, and, while nvinject-nri is down, is refused by
// containerd because of that annotation.
func TestExamplePodGetsRequiredPlugins(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	example := podSpec{gpu: true, runtimeClass: true, asWritten: true, annotations: map[string]string{"team": "ml"}}
	createPod(t, ctx, "example-gpu", example)
	p, err := d.Kube().Client.CoreV1().Pods(ns).Get(ctx, "example-gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Annotations[contract.RequiredPluginsAnnotation]; got != `["`+contract.NRIPluginName+`"]` || p.Annotations["team"] != "ml" {
		t.Errorf("example pod annotations %v: want %s=[\"%s\"] added beside team=ml", p.Annotations, contract.RequiredPluginsAnnotation, contract.NRIPluginName)
	}
	waitPod(t, ctx, "example-gpu", 2*time.Minute, "Running", running)
	if got := containerGPUs(t, ctx, "example-gpu"); !slices.Equal(got, []string{dep.UUID}) {
		t.Errorf("example pod sees %v, want %s", got, dep.UUID)
	}
	deletePod(t, "example-gpu")

	stopNRI(t, ctx)
	createPod(t, ctx, "example-gpu-nri-down", example)
	checkRequiredPluginRefusal(t, ctx, "example-gpu-nri-down")
}
