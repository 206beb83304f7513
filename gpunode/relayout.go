package gpunode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/logging"
)

// A round is one MIG layout's publication: the health tracker and its
// reported health, SIGHUP recovery, the layout watch and the plugin's
// serve over one set of GPUs.
// When the published set changes under it (MIG devices created or
// destroyed, MIG mode switched and the GPU reset) the watch ends the
// round, everything in it is waited for, and publish starts the next one
// over the new set in the same process: the plugins' own start path
// (registration, ResourceSlice) is their republish path.

// WithRepublishMetric exports the count of republishes (MIG layout
// changes published without a restart) as the counter name.
func WithRepublishMetric(name string) Option {
	return func(n *Node) {
		n.republishes = prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: "MIG layout changes republished without a restart (CDI spec rewritten, GPUs published again)."})
		n.reg.MustRegister(n.republishes)
	}
}

// errRelayout ends a round whose layout changed; it never leaves the Node.
var errRelayout = errors.New("the MIG layout changed")

// relayout is the layout the next round publishes.
type relayout struct {
	node gpu.Node
	// layout is node's fingerprint (backend's MIGLayout).
	layout string
	gpus   []string
}

// round runs health tracking, recovery, the layout watch and serve over
// gpus until ctx ends, serve returns or the published set changes; it
// returns after all of them did, with the next layout in the last case.
func (n *Node) round(ctx context.Context, b *backend.Backend, gpus GPUs, layout string, serve Serve) (*relayout, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rescan := make(chan struct{}, 1)
	var next *relayout
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { gpus.Health.Run(ctx, b); return nil })
	g.Go(func() error { gpus.Reported.Run(ctx); return nil })
	g.Go(func() error { n.recoverOnSignal(ctx, gpus.Health, rescan); return nil })
	g.Go(func() error { n.publishLabels(ctx, gpus.labels); return nil })
	g.Go(func() error { return n.watchDriver(ctx, gpus) })
	g.Go(func() error {
		var err error
		next, err = n.watchLayout(ctx, b, n.publishedSet(gpus.Published), layout, rescan)
		return err
	})
	g.Go(func() error {
		defer cancel()
		return serve(ctx, gpus)
	})
	if err := g.Wait(); !errors.Is(err, errRelayout) {
		return nil, err
	}
	return next, nil
}

// watchLayout reads the layout's fingerprint every --mig-rescan-interval
// and on each rescan. A new fingerprint is discovered and planned in full;
// it returns errRelayout, with the layout, once the published set differs
// from current. A layout that cannot be published keeps the current set
// served, /readyz saying why, until the layout changes again.
func (n *Node) watchLayout(ctx context.Context, b *backend.Backend, current []string, seen string, rescan <-chan struct{}) (*relayout, error) {
	var tick <-chan time.Time
	if n.cfg.MIGRescan > 0 {
		t := time.NewTicker(n.cfg.MIGRescan)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil, nil
		case <-tick:
		case <-rescan:
		}
		layout, err := b.MIGLayout(ctx)
		if err != nil {
			if ctx.Err() == nil {
				n.log.Warn("cannot read the MIG layout; keeping the published GPUs, trying again at the next rescan", logging.Err(err))
			}
			continue
		}
		if layout == seen {
			continue
		}
		node, err := b.Discover(ctx)
		if err != nil {
			if ctx.Err() == nil {
				n.log.Warn("the MIG layout changed but the GPUs cannot be discovered; keeping the published GPUs, trying again at the next rescan", logging.Err(err))
			}
			continue
		}
		seen = layout
		p, err := n.plan(node)
		if err != nil {
			n.log.Error("the MIG layout changed to one that cannot be published; the GPUs published before stay published until it can", logging.Err(err))
			n.state.SetNotReady(fmt.Sprintf("the MIG layout changed to one that cannot be published (%v); serving the GPUs published before", err))
			continue
		}
		next := n.publishedSet(p.published)
		if slices.Equal(next, current) {
			n.state.SetReady()
			continue
		}
		added, removed := diff(current, next)
		n.state.SetNotReady(fmt.Sprintf("republishing: the MIG layout changed (added %s; removed %s)", orNone(added), orNone(removed)))
		return &relayout{node: node, layout: layout, gpus: next}, errRelayout
	}
}

// republished logs the change from the round before and counts it; the
// next round's GPUs are prepared.
func (n *Node) republished(before GPUs, after []string) {
	added, removed := diff(n.publishedSet(before.Published), after)
	n.log.Info("MIG layout changed: republishing the GPUs without a restart", "added", added, "removed", removed)
	for _, d := range before.Published {
		for _, m := range d.MIG {
			if slices.Contains(removed, migKey(m)) {
				n.log.Warn("MIG device left the layout: no new container gets it; a running container that holds it keeps it until it ends (the driver refuses to destroy an instance in use)",
					"uuid", m.UUID, "profile", m.Profile, "parent_uuid", d.UUID, "gpu_instance", m.GPUInstance, "compute_instance", m.ComputeInstance)
			}
		}
		if slices.Contains(removed, d.UUID) && n.healthy != nil {
			n.healthy.DeletePartialMatch(map[string]string{"uuid": d.UUID})
		}
	}
	if n.republishes != nil {
		n.republishes.Inc()
	}
}

// publishedSet is what a republish compares: each published GPU's UUID,
// and each MIG device's under it with its profile, sorted; MIG devices the
// plugin made on demand are its own business (WithMIGOnDemand).
func (n *Node) publishedSet(devs []gpu.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.UUID)
		if d.MIGEnabled {
			for _, m := range d.MIG {
				if n.migOwned != nil && n.migOwned(d.UUID, m.Placement) {
					continue
				}
				out = append(out, migKey(m))
			}
		}
	}
	slices.Sort(out)
	return out
}

// migKey names a MIG device in the published set: a profile change under
// one UUID (an instance re-created in a destroyed one's place) is a change.
func migKey(m gpu.MIGDevice) string { return m.UUID + " " + m.Profile }

// diff returns what next has that current lacks, and the reverse.
func diff(current, next []string) (added, removed []string) {
	for _, u := range next {
		if !slices.Contains(current, u) {
			added = append(added, u)
		}
	}
	for _, u := range current {
		if !slices.Contains(next, u) {
			removed = append(removed, u)
		}
	}
	return added, removed
}

func orNone(uuids []string) string {
	if len(uuids) == 0 {
		return "none"
	}
	return strings.Join(uuids, ", ")
}
