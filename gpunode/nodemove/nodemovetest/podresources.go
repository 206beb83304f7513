// Package nodemovetest is kubelet's PodResources service for tests of the
// node-move policy and of the daemons that use it.
package nodemovetest

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResources is kubelet's PodResources List on a real unix socket.
type PodResources struct {
	podresv1.UnimplementedPodResourcesListerServer
	Socket string
	mu     sync.Mutex
	pods   []*podresv1.PodResources
	err    error
}

// Start serves List on socket until the test ends.
func Start(t testing.TB, socket string) *PodResources {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	p, srv := &PodResources{Socket: socket}, grpc.NewServer()
	podresv1.RegisterPodResourcesListerServer(srv, p)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return p
}

// List answers the pods last Set, or the error last Fail gave.
func (p *PodResources) List(context.Context, *podresv1.ListPodResourcesRequest) (*podresv1.ListPodResourcesResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, p.err
	}
	return &podresv1.ListPodResourcesResponse{PodResources: p.pods}, nil
}

// Set makes List answer pods.
func (p *PodResources) Set(pods ...*podresv1.PodResources) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods, p.err = pods, nil
}

// Fail makes List answer err until the next Set.
func (p *PodResources) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}
