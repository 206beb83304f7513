package nodemove

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
)

// lister answers List with the queued responses in turn, then the last.
type lister struct {
	mu    sync.Mutex
	resps []*podresv1.ListPodResourcesResponse
	errs  []error
}

func (l *lister) List(context.Context, *podresv1.ListPodResourcesRequest, ...grpc.CallOption) (*podresv1.ListPodResourcesResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, err := l.resps[0], l.errs[0]
	if len(l.resps) > 1 {
		l.resps, l.errs = l.resps[1:], l.errs[1:]
	}
	return r, err
}

func pod(ns, name string, devs ...*podresv1.ContainerDevices) *podresv1.PodResources {
	return &podresv1.PodResources{Namespace: ns, Name: name, Containers: []*podresv1.ContainerResources{{Name: "main", Devices: devs}}}
}

// claimPod is a pod whose containers hold claim's device of driver.
func claimPod(ns, name, claim, driver, device string, containers ...string) *podresv1.PodResources {
	p := &podresv1.PodResources{Namespace: ns, Name: name}
	for _, c := range containers {
		p.Containers = append(p.Containers, &podresv1.ContainerResources{Name: c, DynamicResources: []*podresv1.DynamicResource{{
			ClaimName: claim, ClaimNamespace: ns,
			ClaimResources: []*podresv1.ClaimResource{{DriverName: driver, PoolName: "node-a", DeviceName: device,
				CdiDevices: []*podresv1.CDIDevice{{Name: "nvidia.com/gpu=GPU-x"}}}},
		}}})
	}
	return p
}

func devs(resource string, ids ...string) *podresv1.ContainerDevices {
	return &podresv1.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

var (
	gpus = []gpu.Device{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}, {UUID: "GPU-c", Index: 2, MIGEnabled: true, MIG: []gpu.MIGDevice{
		{UUID: "MIG-c0", ParentUUID: "GPU-c", Profile: "3g.40gb", GPUInstance: 1}, {UUID: "MIG-c1", ParentUUID: "GPU-c", Profile: "1g.10gb", GPUInstance: 2}}}}
	dp  = DevicePluginPods("nvidia.com/gpu")
	dra = DRAClaims(contract.DRADriver)
)

func TestPoll(t *testing.T) {
	tests := []struct {
		name string
		pods []*podresv1.PodResources
		src  Source
		want Holders
	}{
		{"none", nil, dp, Holders{}},
		{"by UUID", []*podresv1.PodResources{pod("default", "vllm", devs("nvidia.com/gpu", "GPU-b"))}, dp, Holders{"GPU-b": {{Pod: "default/vllm", Container: "main"}}}},
		{"by index (DEVICE_ID_STRATEGY=index)", []*podresv1.PodResources{pod("default", "vllm", devs("nvidia.com/gpu", "0"))}, dp, Holders{"GPU-a": {{Pod: "default/vllm", Container: "main"}}}},
		{"another resource, an unknown ID", []*podresv1.PodResources{pod("default", "nic", devs("example.com/nic", "GPU-a")), pod("default", "x", devs("nvidia.com/gpu", "GPU-zz"))}, dp, Holders{}},
		{"two holders, sorted", []*podresv1.PodResources{pod("b", "p2", devs("nvidia.com/gpu", "GPU-a")), pod("a", "p1", devs("nvidia.com/gpu", "GPU-a"))}, dp,
			Holders{"GPU-a": {{Pod: "a/p1", Container: "main"}, {Pod: "b/p2", Container: "main"}}}},
		{"device plugin ignores DRA claims", []*podresv1.PodResources{claimPod("default", "vllm", "gpu", contract.DRADriver, "gpu-0", "main")}, dp, Holders{}},
		{"DRA claim by device name", []*podresv1.PodResources{claimPod("default", "vllm", "vllm-gpu-x7", contract.DRADriver, "gpu-1", "main", "sidecar")}, dra,
			Holders{"GPU-b": {{Pod: "default/vllm", Container: "main", Claim: "default/vllm-gpu-x7"}, {Pod: "default/vllm", Container: "sidecar", Claim: "default/vllm-gpu-x7"}}}},
		{"MIG device by UUID and by index, through a MIG resource", []*podresv1.PodResources{
			pod("default", "small", devs("nvidia.com/mig-1g.10gb", "MIG-c1")), pod("default", "big", devs("nvidia.com/mig-3g.40gb", "2:0"))}, dp,
			Holders{"MIG-c1": {{Pod: "default/small", Container: "main"}}, "MIG-c0": {{Pod: "default/big", Container: "main"}}}},
		{"time-slicing replica", []*podresv1.PodResources{pod("default", "sliced", devs("nvidia.com/gpu", "GPU-a::3"))}, dp, Holders{"GPU-a": {{Pod: "default/sliced", Container: "main"}}}},
		{"DRA claims of shares of one GPU", []*podresv1.PodResources{claimPod("default", "s1", "share-1", contract.DRADriver, contract.DRAShareDeviceName(0), "main"),
			claimPod("default", "s2", "share-2", contract.DRADriver, contract.DRAShareDeviceName(0), "main")}, dra,
			Holders{"GPU-a": {{Pod: "default/s1", Container: "main", Claim: "default/share-1"}, {Pod: "default/s2", Container: "main", Claim: "default/share-2"}}}},
		{"DRA claim on a MIG device", []*podresv1.PodResources{claimPod("default", "small", "c", contract.DRADriver, contract.DRAMIGDeviceName(2, "1g.10gb", 2, 0), "main")}, dra,
			Holders{"MIG-c1": {{Pod: "default/small", Container: "main", Claim: "default/c"}}}},
		{"DRA: another driver, an unknown device, device-plugin devices", []*podresv1.PodResources{
			claimPod("default", "nic", "nic", "example.com", "gpu-0", "main"), claimPod("default", "x", "c", contract.DRADriver, "gpu-9", "main"),
			pod("default", "dp", devs("nvidia.com/gpu", "GPU-a"))}, dra, Holders{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &lister{resps: []*podresv1.ListPodResourcesResponse{{PodResources: tt.pods}}, errs: []error{nil}}
			got, err := New(l, tt.src, gpus).Poll(context.Background())
			if err != nil || !got.Equal(tt.want) {
				t.Errorf("Poll = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// TestRun: set is called on each change only, a failed poll included
// (the caller withholds every GPU until the next success).
// Run reports each change; a failure right after a good answer is hidden
// for the grace (a kubelet restart), one with no good answer before it or
// past the grace is reported.
func TestRun(t *testing.T) {
	held := &podresv1.ListPodResourcesResponse{PodResources: []*podresv1.PodResources{pod("default", "vllm", devs("nvidia.com/gpu", "GPU-a"))}}
	free := &podresv1.ListPodResourcesResponse{}
	refused := errors.New("connection refused")
	vllm := Holders{"GPU-a": {{Pod: "default/vllm", Container: "main"}}}
	for _, tc := range []struct {
		name  string
		grace time.Duration
		start Result
		resps []*podresv1.ListPodResourcesResponse
		errs  []error
		want  []Result
	}{
		{"no grace: every failure reported", 0, Result{Holders: Holders{}},
			[]*podresv1.ListPodResourcesResponse{held, held, nil, nil, free}, []error{nil, nil, refused, refused, nil},
			[]Result{{Holders: vllm}, {Err: refused}, {Holders: Holders{}}}},
		{"a failure within the grace keeps the last answer", time.Minute, Result{Holders: Holders{}},
			[]*podresv1.ListPodResourcesResponse{held, held, nil, nil, free}, []error{nil, nil, refused, refused, nil},
			[]Result{{Holders: vllm}, {Holders: Holders{}}}},
		{"before any good answer a failure is reported", time.Minute, Result{Err: refused},
			[]*podresv1.ListPodResourcesResponse{nil, held}, []error{errors.New("other"), nil},
			[]Result{{Err: refused}, {Holders: vllm}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &lister{resps: tc.resps, errs: tc.errs}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			got := make(chan Result, 10)
			done := make(chan struct{})
			go func() {
				defer close(done)
				New(l, dp, gpus, WithInterval(time.Millisecond), WithGrace(tc.grace)).Run(ctx, tc.start, func(r Result) { got <- r })
			}()
			for i, want := range tc.want {
				select {
				case r := <-got:
					if !r.Holders.Equal(want.Holders) || (r.Err == nil) != (want.Err == nil) {
						t.Errorf("change %d = %+v, want %+v", i, r, want)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("change %d never came", i)
				}
			}
			select {
			case r := <-got:
				t.Errorf("set called without a change: %+v", r)
			case <-time.After(300 * time.Millisecond):
			}
			cancel()
			<-done
		})
	}
}
