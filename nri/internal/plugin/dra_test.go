package plugin_test

import (
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvinject/nvinject/nri/internal/nritest"
)

// A DRA container (CDI names from kubelet's CRI CDIDevices, which
// containerd applies itself) is checked against its claim exactly as a
// device-plugin container is against its devices; a refusal names the claim.
func TestDRAClaimCheck(t *testing.T) {
	k := &kubelet{}
	ks := &kubelet{}
	e := start(t, envOpts{kubelet: serveKubelet(t, ks)})
	dra := start(t, envOpts{kubelet: serveKubelet(t, k)})
	gpu1, gpu2 := dra.node.Name(1), dra.node.Name(2)
	// Each pod's container is removed after its step, so that none holds
	// gpu1 for the next.
	create := func(p *api.PodSandbox, containerdCDI []string, cri ...string) error {
		_, _, err := dra.create(t, p, nil, containerdCDI, cri...)
		dra.remove(t, p)
		return err
	}
	k.claim("pod-ok", "main", gpu1)

	if err := create(nritest.Pod("ok", "nvidia", nil), []string{gpu1}, gpu1); err != nil {
		t.Fatalf("container gets its claim's GPU, yet refused: %v", err)
	}
	k.reset()
	k.claim("pod-other", "main", gpu1)
	err := create(nritest.Pod("other", "nvidia", nil), []string{gpu2}, gpu2)
	if err == nil || !strings.Contains(err.Error(), "ResourceClaim default/gpu-pod-other") ||
		!strings.Contains(err.Error(), dra.node.Devices[1].UUID) || !strings.Contains(err.Error(), dra.node.Devices[2].UUID) {
		t.Fatalf("container gets another GPU than its claim: err = %v, want a refusal naming the claim and both UUIDs", err)
	}
	// As containerd 2.2 really does it: it applies the CRI CDIDevices
	// itself and passes no names to NRI; the claim supplies them.
	k.reset()
	k.claim("pod-cd-ok", "main", gpu1)
	if err := create(nritest.Pod("cd-ok", "nvidia", nil), []string{gpu1}); err != nil {
		t.Fatalf("containerd-injected claim GPU refused: %v", err)
	}
	k.reset()
	k.claim("pod-cd-other", "main", gpu1)
	err = create(nritest.Pod("cd-other", "nvidia", nil), []string{gpu2})
	if err == nil || !strings.Contains(err.Error(), "ResourceClaim default/gpu-pod-cd-other") || !strings.Contains(err.Error(), "/dev/nvidia2") {
		t.Fatalf("containerd injected another GPU than the claim's: err = %v, want a refusal naming the claim and the foreign GPU", err)
	}
	k.reset()
	k.claim("pod-cd-norc", "main", gpu1)
	err = create(nritest.Pod("cd-norc", "", nil), []string{gpu1})
	if err == nil || !strings.Contains(err.Error(), "runtimeClassName: nvidia") || !strings.Contains(err.Error(), "ResourceClaim default/gpu-pod-cd-norc") {
		t.Fatalf("claim pod without the nvidia RuntimeClass: err = %v, want the runtime class refusal naming the claim", err)
	}
	// Neither a device-plugin GPU nor a claim: refused as before.
	k.reset()
	k.assign("pod-none", "main")
	if err := create(nritest.Pod("none", "nvidia", nil), []string{gpu1}, gpu1); err == nil {
		t.Fatal("a GPU container without any kubelet assignment was accepted")
	}
	// The device-plugin path is unchanged.
	ks.assign("pod-dp", "main", e.node.Devices[1].UUID)
	if _, _, err := e.create(t, nritest.Pod("dp", "nvidia", nil), nil, []string{e.node.Name(1)}, e.node.Name(1)); err != nil {
		t.Fatalf("device-plugin container refused: %v", err)
	}
}

// TestPodResourcesAskedOncePerContainer: through the runtime's whole
// creation (CreateContainer, then the validation of the final container)
// kubelet's PodResources is asked exactly once for a GPU container, DRA
// (whose CDI names come from its claims in CreateContainer) or device
// plugin (asked in the validation).
func TestPodResourcesAskedOncePerContainer(t *testing.T) {
	k := &kubelet{}
	e := start(t, envOpts{kubelet: serveKubelet(t, k)})
	gpu1 := e.node.Name(1)
	for _, tc := range []struct {
		name   string
		assign func()
		dra    bool
	}{
		{"DRA", func() { k.claim("pod-c", "main", gpu1) }, true},
		{"device plugin", func() { k.assign("pod-c", "main", e.node.Devices[1].UUID) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k.reset()
			tc.assign()
			pod := nritest.Pod("c", "nvidia", nil)
			err := e.createOne(t, pod, gpu1, tc.dra)
			e.remove(t, pod)
			if err != nil {
				t.Fatal(err)
			}
			if n := k.listed(); n != 1 {
				t.Errorf("PodResources List called %d times for one container's creation, want 1", n)
			}
		})
	}
}
