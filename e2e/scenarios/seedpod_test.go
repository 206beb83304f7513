package scenarios

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvinject/nvinject/shared/contract"
)

// The seed's GPU pod as written (RuntimeClass nvidia, nvidia.com/gpu: 1, no
// annotation) is admitted with the required-plugins annotation, runs with
// the selected GPU, and, while nvinject-nri is down, is refused by
// containerd because of that annotation.
func TestSeedPodGetsRequiredPlugins(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	seed := podSpec{gpu: true, runtimeClass: true, seed: true, annotations: map[string]string{"team": "ml"}}
	createPod(t, ctx, "seed-gpu", seed)
	p, err := d.Kube().Client.CoreV1().Pods(ns).Get(ctx, "seed-gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Annotations[contract.RequiredPluginsAnnotation]; got != `["`+contract.NRIPluginName+`"]` || p.Annotations["team"] != "ml" {
		t.Errorf("seed pod annotations %v: want %s=[\"%s\"] added beside team=ml", p.Annotations, contract.RequiredPluginsAnnotation, contract.NRIPluginName)
	}
	waitPod(t, ctx, "seed-gpu", 2*time.Minute, "Running", running)
	if got := containerGPUs(t, ctx, "seed-gpu"); !slices.Equal(got, []string{dep.UUID}) {
		t.Errorf("seed pod sees %v, want %s", got, dep.UUID)
	}
	deletePod(t, "seed-gpu")

	stopNRI(t, ctx)
	createPod(t, ctx, "seed-gpu-nri-down", seed)
	checkRequiredPluginRefusal(t, ctx, "seed-gpu-nri-down")
}
