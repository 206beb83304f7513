package nodemove

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/podresources"
	"github.com/nvinject/nvinject/shared/sharing"
)

// Lister is the PodResources call the watcher needs (the generated client
// has it; a test's kubelet too).
type Lister = podresources.Lister

// Holder is one container holding a GPU.
type Holder struct {
	// Pod is "namespace/name".
	Pod       string
	Container string
	// Claim is the ResourceClaim ("namespace/name") the container holds the
	// GPU through; empty for a device-plugin holder.
	Claim string
}

func (h Holder) String() string {
	s := h.Pod + "/" + h.Container
	if h.Claim != "" {
		s += " (claim " + h.Claim + ")"
	}
	return s
}

// Holders maps a GPU UUID to the containers holding it, sorted.
type Holders map[string][]Holder

// Equal says whether h and o name the same GPUs and holders.
func (h Holders) Equal(o Holders) bool { return maps.EqualFunc(h, o, slices.Equal[[]Holder]) }

// Strings renders one GPU's holders for a log line.
func Strings(hs []Holder) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.String()
	}
	return out
}

// Source says which path's assignments the watcher reports, and so which
// daemon withholds them and how: the words of the Set's log lines.
type Source struct {
	resource  string
	draDriver string
	// via and holders name the path ("DRA", "DRA claims"), one one holder
	// ("a DRA claim"), withhold what the daemon does to a held GPU.
	via, holders, one, withhold string
}

// publishes says whether the device plugin publishes resource: its GPU
// resource, or one of that domain's MIG resources (MIG_STRATEGY=mixed).
func (s Source) publishes(resource string) bool {
	return resource == s.resource || strings.HasPrefix(resource, contract.MIGResourceName(s.resource, ""))
}

// DevicePluginPods reports GPUs and MIG devices given through the
// device-plugin resource and its MIG resources (device IDs: UUID, or index
// under DEVICE_ID_STRATEGY=index), which nvinject-dra taints.
func DevicePluginPods(resource string) Source {
	return Source{resource: resource, via: "the device plugin", holders: "device-plugin pods", one: "a device-plugin pod", withhold: "tainted " + contract.DRAHeldTaintKey}
}

// DRAClaims reports GPUs and MIG devices given through driver's claims, by
// device name (contract.DRADeviceName, DRAShareDeviceName, DRAMIGDeviceName,
// as nvinject-dra publishes them), which the device plugin publishes
// Unhealthy.
func DRAClaims(driver string) Source {
	return Source{draDriver: driver, via: "DRA", holders: "DRA claims", one: "a DRA claim", withhold: "published Unhealthy"}
}

// Watcher polls kubelet for the holders of the node's GPUs.
type Watcher struct {
	pods *podresources.Client
	conn io.Closer
	src  Source
	// ids maps a device-plugin device ID or a DRA device name to the GPU's UUID.
	ids   map[string]string
	every time.Duration
	grace time.Duration
}

// DefaultGrace is how long a failing List keeps the last good answer: longer
// than a kubelet restart (its PodResources socket is gone for under a
// second), so a restart does not withhold every GPU while kubelet admits
// pods again. No claim is prepared while kubelet is down, and nvinject-nri
// still refuses a second holder.
const DefaultGrace = 5 * time.Second

// retryEvery is the poll period while List fails within the grace.
const retryEvery = 100 * time.Millisecond

// Option configures a Watcher.
type Option func(*Watcher)

// WithInterval sets the poll period (default 1 s: a pod waiting for the GPU
// gets it about that long after the other path's pod ended; a List is one
// local gRPC call).
func WithInterval(d time.Duration) Option { return func(w *Watcher) { w.every = d } }

// WithGrace sets how long a failing List keeps the last good answer
// (default DefaultGrace; 0 reports every failure at once).
func WithGrace(d time.Duration) Option { return func(w *Watcher) { w.grace = d } }

// New watches src's assignments of gpus.
func New(l Lister, src Source, gpus []gpu.Device, opts ...Option) *Watcher {
	w := &Watcher{pods: podresources.New(l, podresources.WithTimeout(2*time.Second)), src: src, ids: map[string]string{}, every: time.Second, grace: DefaultGrace}
	for _, g := range gpus {
		if src.draDriver != "" {
			w.ids[contract.DRADeviceName(g.Index)] = g.UUID
			w.ids[contract.DRAShareDeviceName(g.Index)] = g.UUID
			for _, m := range g.MIG {
				w.ids[contract.DRAMIGDeviceName(g.Index, m.Profile, m.GPUInstance, m.ComputeInstance)] = m.UUID
			}
			continue
		}
		w.ids[g.UUID] = g.UUID
		w.ids[strconv.Itoa(g.Index)] = g.UUID
		for i, m := range g.MIG {
			w.ids[m.UUID] = m.UUID
			w.ids[contract.MIGDeviceIndexID(g.Index, i)] = m.UUID
		}
	}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Dial watches kubelet's PodResources at socket. The connection is made
// on first use, so a missing socket is a failed Poll, not an error here.
// Close the watcher when done.
func Dial(socket string, src Source, gpus []gpu.Device, opts ...Option) (*Watcher, error) {
	c, err := podresources.Dial(socket)
	if err != nil {
		return nil, err
	}
	w := New(nil, src, gpus, opts...)
	w.pods, w.conn = c, c
	return w, nil
}

// Close ends a dialled watcher's connection.
func (w *Watcher) Close() error {
	if w.conn == nil {
		return nil
	}
	return w.conn.Close()
}

// Poll asks kubelet once.
func (w *Watcher) Poll(ctx context.Context) (Holders, error) {
	pods, err := w.pods.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w; mount kubelet's pod-resources dir (/var/lib/kubelet/pod-resources) into the pod", err)
	}
	h := Holders{}
	for _, p := range pods {
		pod := p.Namespace + "/" + p.Name
		for _, c := range p.Containers {
			for u, claim := range w.held(c) {
				h[u] = append(h[u], Holder{Pod: pod, Container: c.Name, Claim: claim})
			}
		}
	}
	for u := range h {
		slices.SortFunc(h[u], func(a, b Holder) int {
			return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.Container, b.Container), cmp.Compare(a.Claim, b.Claim))
		})
		h[u] = slices.Compact(h[u])
	}
	return h, nil
}

// held maps the GPUs container c holds through the watched path to the
// claim it holds each through ("" for the device plugin).
func (w *Watcher) held(c podresources.Container) map[string]string {
	out := map[string]string{}
	if w.src.resource != "" {
		for _, id := range c.IDs(w.src.publishes) {
			// A time-slicing replica "<id>::<n>" holds its device.
			if dev, ok := sharing.DeviceOf(id); ok {
				id = dev
			}
			if u, ok := w.ids[id]; ok {
				out[u] = ""
			}
		}
		return out
	}
	for _, cl := range c.ClaimsOf(w.src.draDriver) {
		for _, d := range cl.Devices {
			if u, ok := w.ids[d.Device]; ok {
				out[u] = cl.Namespace + "/" + cl.Name
			}
		}
	}
	return out
}

// Follow polls kubelet into s until ctx ends, then closes the watcher: the
// first answer at once (s.Read is closed after it), then every change.
func (w *Watcher) Follow(ctx context.Context, s *Set) {
	defer w.Close()
	var r Result
	r.Holders, r.Err = w.Poll(ctx)
	s.Update(r)
	w.Run(ctx, r, s.Update)
}

// Result is one poll's answer: the holders, or Err when kubelet could not
// be read (the caller then cannot tell which GPUs are free).
type Result struct {
	Holders Holders
	Err     error
}

func (r Result) same(o Result) bool {
	if (r.Err == nil) != (o.Err == nil) || (r.Err != nil && r.Err.Error() != o.Err.Error()) {
		return false
	}
	return r.Holders.Equal(o.Holders)
}

// Run polls until ctx ends and calls set with every change, starting from
// last (what the caller already knows, such as its own first Poll): new
// holders, a failure (or another error than the last), or the first
// success after failures. A failure within the grace after a good answer is
// retried every 100 ms and reported only once the grace has passed; before
// any good answer every failure is reported (fail closed).
func (w *Watcher) Run(ctx context.Context, last Result, set func(Result)) {
	var goodAt time.Time
	if last.Err == nil {
		goodAt = time.Now()
	}
	t := time.NewTimer(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h, err := w.Poll(ctx)
		if ctx.Err() != nil {
			return
		}
		next := w.every
		r := Result{Holders: h, Err: err}
		switch {
		case err == nil:
			goodAt = time.Now()
		case !goodAt.IsZero() && time.Since(goodAt) < w.grace:
			r, next = last, retryEvery
		}
		if !r.same(last) {
			set(r)
			last = r
		}
		t.Reset(next)
	}
}
