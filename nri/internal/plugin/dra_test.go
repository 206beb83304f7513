package plugin_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/shared/contract"
)

// draKubelet is a PodResources server whose pods hold DRA claims of
// nvinject-dra (claim "gpu-<pod>") and no device-plugin GPUs.
type draKubelet struct {
	podresv1.UnimplementedPodResourcesListerServer
	claimed map[string]string // pod name → the claim's CDI name
}

func (k *draKubelet) Get(_ context.Context, r *podresv1.GetPodResourcesRequest) (*podresv1.GetPodResourcesResponse, error) {
	ctr := &podresv1.ContainerResources{Name: "main"}
	if n, ok := k.claimed[r.GetPodName()]; ok {
		ctr.DynamicResources = []*podresv1.DynamicResource{{
			ClaimName: "gpu-" + r.GetPodName(), ClaimNamespace: r.GetPodNamespace(),
			ClaimResources: []*podresv1.ClaimResource{{DriverName: contract.DRADriver, PoolName: "node", DeviceName: "gpu-1",
				CdiDevices: []*podresv1.CDIDevice{{Name: n}}}},
		}}
	}
	return &podresv1.GetPodResourcesResponse{PodResources: &podresv1.PodResources{
		Name: r.GetPodName(), Namespace: r.GetPodNamespace(), Containers: []*podresv1.ContainerResources{ctr},
	}}, nil
}

// A DRA container (CDI names from kubelet's CRI CDIDevices, which
// containerd applies itself) is checked against its claim exactly as a
// device-plugin container is against its devices; a refusal names the claim.
func TestDRAClaimCheck(t *testing.T) {
	k := &draKubelet{}
	ks := &kubelet{}
	e := start(t, envOpts{kubelet: serveKubelet(t, ks)})
	dra := start(t, envOpts{kubelet: serveLister(t, k)})
	gpu1, gpu2 := dra.node.Name(1), dra.node.Name(2)
	k.claimed = map[string]string{"pod-ok": gpu1, "pod-other": gpu1}

	if _, _, err := dra.create(t, nritest.Pod("ok", "nvidia", nil), nil, []string{gpu1}, gpu1); err != nil {
		t.Fatalf("container gets its claim's GPU, yet refused: %v", err)
	}
	_, _, err := dra.create(t, nritest.Pod("other", "nvidia", nil), nil, []string{gpu2}, gpu2)
	if err == nil || !strings.Contains(err.Error(), "ResourceClaim default/gpu-pod-other") ||
		!strings.Contains(err.Error(), dra.node.Devices[1].UUID) || !strings.Contains(err.Error(), dra.node.Devices[2].UUID) {
		t.Fatalf("container gets another GPU than its claim: err = %v, want a refusal naming the claim and both UUIDs", err)
	}
	// As containerd 2.2 really does it: it applies the CRI CDIDevices
	// itself and passes no names to NRI; the claim supplies them.
	k.claimed["pod-cd-ok"], k.claimed["pod-cd-other"], k.claimed["pod-cd-norc"] = gpu1, gpu1, gpu1
	if _, _, err := dra.create(t, nritest.Pod("cd-ok", "nvidia", nil), nil, []string{gpu1}); err != nil {
		t.Fatalf("containerd-injected claim GPU refused: %v", err)
	}
	_, _, err = dra.create(t, nritest.Pod("cd-other", "nvidia", nil), nil, []string{gpu2})
	if err == nil || !strings.Contains(err.Error(), "ResourceClaim default/gpu-pod-cd-other") || !strings.Contains(err.Error(), "/dev/nvidia2") {
		t.Fatalf("containerd injected another GPU than the claim's: err = %v, want a refusal naming the claim and the foreign GPU", err)
	}
	_, _, err = dra.create(t, nritest.Pod("cd-norc", "", nil), nil, []string{gpu1})
	if err == nil || !strings.Contains(err.Error(), "runtimeClassName: nvidia") || !strings.Contains(err.Error(), "ResourceClaim default/gpu-pod-cd-norc") {
		t.Fatalf("claim pod without the nvidia RuntimeClass: err = %v, want the runtime class refusal naming the claim", err)
	}
	// Neither a device-plugin GPU nor a claim: refused as before.
	if _, _, err := dra.create(t, nritest.Pod("none", "nvidia", nil), nil, []string{gpu1}, gpu1); err == nil {
		t.Fatal("a GPU container without any kubelet assignment was accepted")
	}
	// The device-plugin path is unchanged.
	ks.assigned = map[string][]string{"pod-dp": {e.node.Devices[1].UUID}}
	if _, _, err := e.create(t, nritest.Pod("dp", "nvidia", nil), nil, []string{e.node.Name(1)}, e.node.Name(1)); err != nil {
		t.Fatalf("device-plugin container refused: %v", err)
	}
}

func serveLister(t *testing.T, srv podresv1.PodResourcesListerServer) string {
	t.Helper()
	sock := filepath.Join(shortDir(t), "kubelet.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	podresv1.RegisterPodResourcesListerServer(g, srv)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	return sock
}
