package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"
	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nvinject/nvinject/nri/internal/collect"
	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/nri/internal/resolve"
	"github.com/nvinject/nvinject/nri/internal/verify"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/podresources"
)

// lister is kubelet's PodResources List answering pods or err, counting
// the calls.
type lister struct {
	pods  []podresources.Pod
	err   error
	calls int
}

func (l *lister) List(context.Context) ([]podresources.Pod, error) {
	l.calls++
	return l.pods, l.err
}

func testHandler(t *testing.T, node nritest.Node, k Kubelet) *Handler {
	t.Helper()
	col, err := collect.New()
	if err != nil {
		t.Fatal(err)
	}
	res, err := resolve.New([]string{node.SpecDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Close() })
	return NewHandler(col, res, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithKubelet(k))
}

// gpuContainer is container main of pod c naming names in the device
// plugin's annotation, with applied already applied by containerd's CDI
// (as for a DRA container).
func gpuContainer(t *testing.T, node nritest.Node, names []string, applied []string) *api.Container {
	t.Helper()
	s := nritest.BaseSpec()
	if len(applied) > 0 {
		nritest.ContainerdCDI(t, s, node.SpecDir, applied...)
	}
	var ann map[string]string
	if len(names) > 0 {
		ann = map[string]string{contract.DevicesAnnotation: strings.Join(names, ",")}
	}
	return nritest.Container("ctr-c", "c", "main", s, ann)
}

func claim(name string) podresources.Claim {
	return podresources.Claim{Namespace: "default", Name: "gpu-c", Devices: []podresources.ClaimDevice{{Driver: contract.DRADriver, Pool: "node", Device: "gpu-1", CDIDevices: []string{name}}}}
}

// TestBuild: what one container's request holds, for each way a GPU is
// requested, and when kubelet is asked to build it.
func TestBuild(t *testing.T) {
	node := nritest.NewNode(t, "sim:a100-80gb*2", false)
	n0, n1 := node.Name(0), node.Name(1)
	u0, u1 := node.Devices[0].UUID, node.Devices[1].UUID
	own := func(c podresources.Container) []podresources.Pod {
		c.Name = "main"
		return []podresources.Pod{{Namespace: "default", Name: "pod-c", Containers: []podresources.Container{c}}}
	}
	down := errors.New("kubelet is restarting")
	for _, tc := range []struct {
		name    string
		handler string
		podAnn  map[string]string
		names   []string // the device plugin's annotation
		applied []string // containerd's CDI applied these
		kubelet []podresources.Pod
		listErr error
		// want
		reason    string // "": built
		cdi       []string
		claims    string
		gpus      []string
		asks      int
		assigned  bool
		whoSuffix string
	}{
		{name: "device-plugin IDs: the container's own names, kubelet not asked yet", handler: "nvidia", names: []string{n0},
			kubelet: own(podresources.Container{Devices: []podresources.Devices{{Resource: contract.ResourceName, IDs: []string{u0}}}}), cdi: []string{n0}, gpus: []string{u0}},
		{name: "DRA claim: containerd applied it, the claim names it", handler: "nvidia", applied: []string{n1},
			kubelet: own(podresources.Container{Claims: []podresources.Claim{claim(n1)}}),
			cdi:     []string{n1}, claims: "ResourceClaim default/gpu-c", gpus: []string{u1}, asks: 1, assigned: true, whoSuffix: " (ResourceClaim default/gpu-c)"},
		{name: "both: the container's own names; its claims are compared in the final check", handler: "nvidia", names: []string{n0}, applied: []string{n0},
			kubelet: own(podresources.Container{Devices: []podresources.Devices{{Resource: contract.ResourceName, IDs: []string{u0}}}, Claims: []podresources.Claim{claim(n1)}}), cdi: []string{n0}, gpus: []string{u0}},
		{name: "none", handler: "nvidia", kubelet: own(podresources.Container{})},
		{name: "pod-level request", handler: "nvidia", podAnn: map[string]string{"cdi.k8s.io/x": n1}, names: []string{n0},
			reason: ReasonPodLevel, cdi: []string{n0}},
		{name: "unresolvable name", handler: "nvidia", names: []string{"nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000"},
			reason: ReasonUnresolvable, cdi: []string{"nvidia.com/gpu=GPU-00000000-0000-0000-0000-000000000000"}},
		{name: "DRA claim, kubelet down", handler: "nvidia", applied: []string{n1}, listErr: down, reason: ReasonKubeletDown, asks: 1},
		{name: "DRA claim, pod not listed", handler: "nvidia", applied: []string{n1}, reason: ReasonKubeletDown, asks: 1},
		{name: "DRA claim outside the served handlers: names only, to refuse", applied: []string{n1},
			kubelet: own(podresources.Container{Claims: []podresources.Claim{claim(n1)}}),
			cdi:     []string{n1}, claims: "ResourceClaim default/gpu-c", asks: 1, assigned: true, whoSuffix: " (ResourceClaim default/gpu-c)"},
		{name: "kubelet down outside the served handlers: admitted", applied: []string{n1}, listErr: down, asks: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &lister{pods: tc.kubelet, err: tc.listErr}
			h := testHandler(t, node, k)
			pod := nritest.Pod("c", tc.handler, tc.podAnn)
			r, err := h.build(context.Background(), pod, gpuContainer(t, node, tc.names, tc.applied))
			if got := reasonOf(err); (err != nil || tc.reason != "") && got != tc.reason {
				t.Fatalf("build: %v (reason %s), want reason %q", err, got, tc.reason)
			}
			if !slices.Equal(r.names, tc.cdi) || r.claims != tc.claims || !slices.Equal(verify.UUIDs(r.gpus), tc.gpus) {
				t.Errorf("names %v claims %q GPUs %v, want %v %q %v", r.names, r.claims, verify.UUIDs(r.gpus), tc.cdi, tc.claims, tc.gpus)
			}
			if k.calls != tc.asks || (r.kubelet != nil) != tc.assigned {
				t.Errorf("kubelet asked %d times (kept: %v), want %d (%v)", k.calls, r.kubelet != nil, tc.asks, tc.assigned)
			}
			if want := "container main of pod default/pod-c" + tc.whoSuffix; r.who != want {
				t.Errorf("who %q, want %q", r.who, want)
			}
			if r.podUID != "uid-c" || r.sandbox != "c" || r.ctr != "main" {
				t.Errorf("built for %s/%s/%s", r.podUID, r.sandbox, r.ctr)
			}
			if rec := h.record(r); !slices.Equal(rec.CDI, tc.cdi) || rec.Assigned.Asked != tc.assigned {
				t.Errorf("record %+v", rec)
			}
		})
	}
}

// TestOneRequestPerContainer: CreateContainer and the validation of the
// same container share its request, so kubelet's PodResources is asked at
// most once for both; a validation for another pod builds its own.
func TestOneRequestPerContainer(t *testing.T) {
	node := nritest.NewNode(t, "sim:a100-80gb*2", false)
	n0, n1, u0 := node.Name(0), node.Name(1), node.Devices[0].UUID
	listed := func(c podresources.Container) []podresources.Pod {
		c.Name = "main"
		return []podresources.Pod{{Namespace: "default", Name: "pod-c", Containers: []podresources.Container{c}}}
	}
	for _, tc := range []struct {
		name           string
		names, applied []string
		kubelet        []podresources.Pod
		// validated is the pod the validation names: another UID is
		// another pod.
		validated func(*api.PodSandbox)
		asks      int
	}{
		{name: "device plugin", names: []string{n0}, kubelet: listed(podresources.Container{Devices: []podresources.Devices{{Resource: contract.ResourceName, IDs: []string{u0}}}}), asks: 1},
		{name: "DRA", applied: []string{n1}, kubelet: listed(podresources.Container{Claims: []podresources.Claim{claim(n1)}}), asks: 1},
		{name: "DRA, the pod changed", applied: []string{n1}, kubelet: listed(podresources.Container{Claims: []podresources.Claim{claim(n1)}}),
			validated: func(p *api.PodSandbox) { p.Uid = "uid-of-a-new-pod-c" }, asks: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &lister{pods: tc.kubelet}
			h := testHandler(t, node, k)
			ctx := context.Background()
			pod, ctr := nritest.Pod("c", "nvidia", nil), gpuContainer(t, node, tc.names, tc.applied)
			adj, _, err := h.CreateContainer(ctx, pod, ctr)
			if err != nil {
				t.Fatal(err)
			}
			if tc.validated != nil {
				tc.validated(pod)
			}
			if err := h.ValidateContainerAdjustment(ctx, &api.ValidateContainerAdjustmentRequest{Pod: pod, Container: ctr, Adjust: adj}); err != nil {
				t.Fatal(err)
			}
			if k.calls != tc.asks {
				t.Errorf("PodResources List called %d times for CreateContainer and the validation, want %d", k.calls, tc.asks)
			}
			if r := h.requests.take(pod, ctr); r != nil {
				t.Error("the validation left the request behind")
			}
		})
	}
}

// TestRequestsKept: a request is kept for its container's validation
// only, for as long as the container and its pod exist, and the oldest
// go beyond maxRequests.
func TestRequestsKept(t *testing.T) {
	pod := nritest.Pod("p", "nvidia", nil)
	ctr := func(i int) *api.Container {
		return nritest.Container(fmt.Sprint("c", i), "p", "main", &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}, nil)
	}
	req := func() *request { return &request{podUID: pod.GetUid(), sandbox: pod.GetId(), ctr: "main"} }
	var q requests
	q.put("c0", req())
	if q.take(pod, ctr(0)) == nil || q.take(pod, ctr(0)) != nil {
		t.Error("a request is taken once")
	}
	q.put("c0", req())
	other := nritest.Pod("p", "nvidia", nil)
	other.Uid = "uid-of-another-pod-p"
	if q.take(other, ctr(0)) != nil || q.take(pod, ctr(0)) != nil {
		t.Error("a request built for another pod was taken, or kept after")
	}
	for i := range maxRequests + 1 {
		q.put(fmt.Sprint("c", i), req())
	}
	if q.take(pod, ctr(0)) != nil || q.take(pod, ctr(1)) == nil || q.order.Len() != maxRequests-1 {
		t.Errorf("beyond maxRequests: the oldest kept, or %d left", q.order.Len())
	}
	q.drop("c2")
	if q.take(pod, ctr(2)) != nil {
		t.Error("the request of a removed container was kept")
	}
	q.dropPod(pod)
	if q.order.Len() != 0 || len(q.byID) != 0 {
		t.Errorf("%d requests of a removed pod kept", q.order.Len())
	}
	q.put("c3", req())
	q.reset()
	if q.take(pod, ctr(3)) != nil {
		t.Error("a request kept across a reset")
	}
}
