package dpheld

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

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

func devs(resource string, ids ...string) *podresv1.ContainerDevices {
	return &podresv1.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

var gpus = []gpu.Device{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}}

func TestPoll(t *testing.T) {
	tests := []struct {
		name string
		pods []*podresv1.PodResources
		want Holders
	}{
		{"none", nil, Holders{}},
		{"by UUID", []*podresv1.PodResources{pod("default", "vllm", devs("nvidia.com/gpu", "GPU-b"))}, Holders{"GPU-b": {"default/vllm/main"}}},
		{"by index (DEVICE_ID_STRATEGY=index)", []*podresv1.PodResources{pod("default", "vllm", devs("nvidia.com/gpu", "0"))}, Holders{"GPU-a": {"default/vllm/main"}}},
		{"another resource, an unknown ID", []*podresv1.PodResources{pod("default", "nic", devs("example.com/nic", "GPU-a")), pod("default", "x", devs("nvidia.com/gpu", "GPU-zz"))}, Holders{}},
		{"two holders, sorted", []*podresv1.PodResources{pod("b", "p2", devs("nvidia.com/gpu", "GPU-a")), pod("a", "p1", devs("nvidia.com/gpu", "GPU-a"))},
			Holders{"GPU-a": {"a/p1/main", "b/p2/main"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &lister{resps: []*podresv1.ListPodResourcesResponse{{PodResources: tt.pods}}, errs: []error{nil}}
			got, err := New(l, "nvidia.com/gpu", gpus).Poll(context.Background())
			if err != nil || !got.Equal(tt.want) {
				t.Errorf("Poll = %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// TestRun: set is called on each change only; a failed poll keeps the last
// known holders instead of freeing the GPU.
func TestRun(t *testing.T) {
	held := &podresv1.ListPodResourcesResponse{PodResources: []*podresv1.PodResources{pod("default", "vllm", devs("nvidia.com/gpu", "GPU-a"))}}
	free := &podresv1.ListPodResourcesResponse{}
	l := &lister{
		resps: []*podresv1.ListPodResourcesResponse{held, held, nil, free},
		errs:  []error{nil, nil, errors.New("connection refused"), nil},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan Holders, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		New(l, "nvidia.com/gpu", gpus, WithInterval(time.Millisecond)).Run(ctx, Holders{}, func(h Holders) { got <- h })
	}()
	for i, want := range []Holders{{"GPU-a": {"default/vllm/main"}}, {}} {
		select {
		case h := <-got:
			if !h.Equal(want) {
				t.Errorf("change %d = %v, want %v", i, h, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("change %d never came", i)
		}
	}
	select {
	case h := <-got:
		t.Errorf("set called without a change: %v", h)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	<-done
}
