// Package dpheld finds the GPUs kubelet assigned to running containers
// through the device-plugin API (PodResources List). nvinject-dra keeps
// them out of new claims while a node moves from the device plugin to DRA:
// neither the scheduler nor the DRA driver otherwise knows a device-plugin
// pod still uses the GPU, and a claim would hand it out a second time.
package dpheld

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/logging"
)

// Lister is the PodResources call the watcher needs (the generated client
// has it).
type Lister interface {
	List(ctx context.Context, in *podresv1.ListPodResourcesRequest, opts ...grpc.CallOption) (*podresv1.ListPodResourcesResponse, error)
}

// Holders maps a GPU UUID to the containers ("namespace/pod/container")
// holding it through the device plugin.
type Holders map[string][]string

// Equal says whether h and o name the same GPUs and holders.
func (h Holders) Equal(o Holders) bool { return maps.EqualFunc(h, o, slices.Equal[[]string]) }

// Watcher polls kubelet for the device-plugin holders of the node's GPUs.
type Watcher struct {
	list     Lister
	resource string
	// ids maps a device-plugin device ID (UUID, or index under
	// DEVICE_ID_STRATEGY=index) to the GPU's UUID.
	ids     map[string]string
	every   time.Duration
	timeout time.Duration
	log     *slog.Logger
}

// Option configures a Watcher.
type Option func(*Watcher)

// WithInterval sets the poll period (default 1 s: a pod waiting for the GPU
// gets it about that long after the device-plugin pod ended; a List is one
// local gRPC call).
func WithInterval(d time.Duration) Option { return func(w *Watcher) { w.every = d } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(w *Watcher) { w.log = l } }

// New watches resource's assignments of gpus.
func New(l Lister, resource string, gpus []gpu.Device, opts ...Option) *Watcher {
	w := &Watcher{list: l, resource: resource, ids: map[string]string{}, every: time.Second, timeout: 2 * time.Second, log: slog.Default()}
	for _, g := range gpus {
		w.ids[g.UUID] = g.UUID
		w.ids[strconv.Itoa(g.Index)] = g.UUID
	}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Poll asks kubelet once.
func (w *Watcher) Poll(ctx context.Context) (Holders, error) {
	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	resp, err := w.list.List(ctx, &podresv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("list kubelet's pod resources: %w; check --pod-resources-socket and that kubelet's pod-resources dir is mounted", err)
	}
	h := Holders{}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != w.resource {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					if u, ok := w.ids[id]; ok {
						h[u] = append(h[u], p.GetNamespace()+"/"+p.GetName()+"/"+c.GetName())
					}
				}
			}
		}
	}
	for u := range h {
		slices.Sort(h[u])
	}
	return h, nil
}

// Run polls until ctx ends and calls set with every change, starting from
// last (what the caller already knows). A failed poll keeps the last known
// holders and is logged once per distinct error.
func (w *Watcher) Run(ctx context.Context, last Holders, set func(Holders)) {
	t := time.NewTicker(w.every)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h, err := w.Poll(ctx)
		switch {
		case err != nil && ctx.Err() == nil && err.Error() != lastErr:
			w.log.Warn("cannot tell which GPUs device-plugin pods hold; keeping the last known", logging.Err(err))
			lastErr = err.Error()
		case err == nil:
			lastErr = ""
			if !h.Equal(last) {
				set(h)
				last = h
			}
		}
	}
}
