package plugin_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/plugin"
	"github.com/nvinject/nvinject/shared/contract"
)

// writeClaimSpec writes claim uid's own CDI device, sharing uuids, as
// nvinject-dra does for a claim shared by time-slicing.
func writeClaimSpec(t *testing.T, dir, uid string, uuids ...string) {
	t.Helper()
	spec := `{"cdiVersion":"0.6.0","kind":"nvidia.com/claim","devices":[{"name":"` + uid + `",` +
		`"annotations":{"` + contract.SharedClaimAnnotation + `":"` + uid + `","` + contract.SharedClaimUUIDsAnnotation + `":"` + contract.SharedClaimUUIDs(uuids) + `"},` +
		`"containerEdits":{"env":["` + contract.EnvSharedClaim + `=` + uid + `"]}}]}`
	if err := os.WriteFile(filepath.Join(dir, "nvidia.com-claim_"+uid+".json"), []byte(spec), 0o600); err != nil {
		t.Fatal(err)
	}
}

// claimAs gives container ctr of pod the claim named claimName with the
// CDI names, as kubelet lists a claim referenced by several pods.
func (k *kubelet) claimAs(pod, ctr, claimName string, names ...string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.container(pod, ctr)
	var cdi []*podresv1.CDIDevice
	for _, n := range names {
		cdi = append(cdi, &podresv1.CDIDevice{Name: n})
	}
	c.DynamicResources = append(c.DynamicResources, &podresv1.DynamicResource{
		ClaimName: claimName, ClaimNamespace: "default",
		ClaimResources: []*podresv1.ClaimResource{{DriverName: contract.DRADriver, PoolName: "node", DeviceName: "gpu-1", CdiDevices: cdi}},
	})
}

// Pods referencing one shared claim share its GPU; a pod holding that GPU
// through another claim, or without the claim, is refused naming the claim
// and the pods; a claim's own device beside a GPU from elsewhere is
// refused; an unshared claim's GPU still serves one pod.
func TestSharedClaim(t *testing.T) {
	k := &kubelet{}
	// The simulated node's UUIDs are deterministic: the specs go in
	// before the resolver reads the dir.
	uuid1 := nritest.NewNode(t, "sim:a100-80gb*8", false).Devices[1].UUID
	e := start(t, envOpts{kubelet: serveKubelet(t, k), extraDir: func(dir string) {
		writeClaimSpec(t, dir, "uid-shared", uuid1)
		writeClaimSpec(t, dir, "uid-other", uuid1)
	}})
	gpu1, gpu2 := e.node.Name(1), e.node.Name(2)
	shared, other := contract.SharedClaimDevice("nvidia.com", "uid-shared"), contract.SharedClaimDevice("nvidia.com", "uid-other")

	type step struct {
		pod string
		// claims are the pod's claims in kubelet: name → CDI names.
		claims map[string][]string
		// applied are the names containerd applies from the CRI request.
		applied []string
		// want: words of the refusal (nil: admitted); reason its metric.
		want   []string
		reason string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "two pods of one shared claim, a third through another claim", steps: []step{
			{pod: "a", claims: map[string][]string{"shared": {gpu1, shared}}, applied: []string{gpu1, shared}},
			{pod: "b", claims: map[string][]string{"shared": {gpu1, shared}}, applied: []string{gpu1, shared}},
			{pod: "c", claims: map[string][]string{"other": {gpu1, other}}, applied: []string{gpu1, other}, reason: plugin.ReasonHeld,
				want: []string{uuid1, "pod default/pod-a", "ResourceClaim default/shared", "not through shared claim uid-other", "reference the same ResourceClaim"}},
		}},
		{name: "a pod without the claim beside the shared claim's pod", steps: []step{
			{pod: "a", claims: map[string][]string{"shared": {gpu1, shared}}, applied: []string{gpu1, shared}},
			{pod: "d", claims: map[string][]string{"plain": {gpu1}}, applied: []string{gpu1}, reason: plugin.ReasonHeld,
				want: []string{uuid1, "pod default/pod-a", "ResourceClaim default/shared", "a GPU serves one pod"}},
		}},
		{name: "the claim's device with a GPU from elsewhere", steps: []step{
			{pod: "e", claims: map[string][]string{"shared": {gpu2, shared}}, applied: []string{gpu2, shared}, reason: plugin.ReasonSharedClaim,
				want: []string{"container main of pod default/pod-e", shared, "shares " + uuid1 + " through claim uid-shared", "does not get through that claim"}},
		}},
		{name: "the claim's device in one claim, its GPU through another", steps: []step{
			{pod: "f", claims: map[string][]string{"shared": {shared}, "plain": {gpu1}}, applied: []string{gpu1, shared}, reason: plugin.ReasonSharedClaim,
				want: []string{"shares " + uuid1 + " through claim uid-shared"}},
		}},
		{name: "an unshared claim's second pod", steps: []step{
			{pod: "g", claims: map[string][]string{"plain": {gpu1}}, applied: []string{gpu1}},
			{pod: "h", claims: map[string][]string{"plain": {gpu1}}, applied: []string{gpu1}, reason: plugin.ReasonHeld,
				want: []string{uuid1, "pod default/pod-g", "a GPU serves one pod"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k.reset()
			var pods []*api.PodSandbox
			defer func() {
				for _, p := range pods {
					e.remove(t, p)
				}
			}()
			for _, s := range tc.steps {
				for name, names := range s.claims {
					k.claimAs("pod-"+s.pod, "main", name, names...)
				}
				pod := nritest.Pod(s.pod, "nvidia", nil)
				pods = append(pods, pod)
				before := refusals(t, e.reg, s.reason)
				_, _, err := e.create(t, pod, nil, s.applied)
				if s.want == nil {
					if err != nil {
						t.Fatalf("pod %s refused: %v", s.pod, err)
					}
					continue
				}
				wantRefused(t, e, err, before, s.reason, s.want...)
			}
		})
	}
}

// A restarted nvinject-nri knows a running container's shared claim from
// the environment the claim's device gave it: another pod of the claim is
// admitted, a pod of another claim is not.
func TestSharedClaimRebuiltFromSynchronize(t *testing.T) {
	node := nritest.NewNode(t, "sim:a100-80gb*8", false)
	uuid1, gpu1 := node.Devices[1].UUID, node.Name(1)
	writeClaimSpec(t, node.SpecDir, "uid-shared", uuid1)
	shared := contract.SharedClaimDevice("nvidia.com", "uid-shared")
	s := nritest.BaseSpec()
	nritest.ContainerdCDI(t, s, node.SpecDir, gpu1, shared)
	running := nritest.Container("c-a", "a", "main", s, map[string]string{plugin.UUIDsKey: uuid1})
	running.State = api.ContainerState_CONTAINER_RUNNING
	e := start(t, envOpts{pods: []*api.PodSandbox{nritest.Pod("a", "nvidia", nil)}, ctrs: []*api.Container{running},
		extraDir: func(dir string) { writeClaimSpec(t, dir, "uid-shared", uuid1) }})
	if _, _, err := e.create(t, nritest.Pod("b", "nvidia", nil), nil, []string{gpu1, shared}, gpu1, shared); err != nil {
		t.Fatalf("another pod of the running container's shared claim refused: %v", err)
	}
	before := refusals(t, e.reg, plugin.ReasonHeld)
	_, _, err := e.create(t, nritest.Pod("c", "nvidia", nil), nil, []string{gpu1}, gpu1)
	// Pods a and b both hold the GPU; the refusal names whichever the
	// holders' map yields first.
	wantRefused(t, e, err, before, plugin.ReasonHeld, uuid1)
	if !strings.Contains(err.Error(), "pod default/pod-a") && !strings.Contains(err.Error(), "pod default/pod-b") {
		t.Errorf("refusal %q names neither holder, pod-a nor pod-b", err)
	}
}
