package gpunode

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nvinject/nvinject/gpunode/nodelabels"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/logging"
)

// The node's GPU labels (nodelabels): computed with each round's GPUs and
// applied to the Node while the round serves, retried with backoff. A
// failing API server never holds up the round, kubelet's protocol or
// readiness: the labels only steer the scheduler's selectors, and the GPUs
// are served either way. It shows in the publisher's log line (the Node
// and the fix) and in the metric's result="error" count.

// WithNodeLabels publishes the node's GPU labels on the Node
// cfg.NodeName through nodes, and counts the applies by result under the
// metric name.
func WithNodeLabels(nodes nodelabels.Nodes, metric string, opts ...nodelabels.Option) Option {
	return func(n *Node) {
		applies := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metric, Help: "Server-side applies of the node's GPU labels (GFD's names) to its Node, by result (ok, error).",
		}, []string{"result"})
		n.reg.MustRegister(applies)
		count := func(err error) {
			if err != nil {
				applies.WithLabelValues("error").Inc()
				return
			}
			applies.WithLabelValues("ok").Inc()
		}
		n.labels = nodelabels.New(nodes, n.cfg.NodeName, append([]nodelabels.Option{nodelabels.WithLogger(n.log), nodelabels.WithOnApply(count)}, opts...)...)
	}
}

// computeLabels is the round's label set for gpus, published as p was
// planned; mps says whether GPUs can be shared through MPS now.
func (n *Node) computeLabels(gpus GPUs, mps bool) map[string]string {
	if n.labels == nil {
		return nil
	}
	r := nodelabels.Compute(nodelabels.Facts{Node: gpus.Node, Published: gpus.Published, MIG: n.cfg.MIGStrategy,
		ResourceName: n.cfg.ResourceName, Sharing: n.sharing, MPS: mps})
	if len(r.Models) > 1 {
		n.log.Warn("the node's GPUs are of several models; the GPU labels describe one (as GPU feature discovery's do): the first published with MIG off",
			"models", r.Models, "product", r.Labels[contract.GFDLabelProduct])
	}
	for _, bad := range r.Invalid {
		n.log.Warn("GPU label left out: its value is not a valid label value", "label", bad)
	}
	return r.Labels
}

// publishLabels applies the round's labels until one apply succeeds or
// the round ends.
func (n *Node) publishLabels(ctx context.Context, labels map[string]string) {
	if n.labels != nil {
		_ = n.labels.Publish(ctx, labels)
	}
}

// withdrawLabels removes the node's GPU labels once: it publishes no GPU.
// It runs as the node fails, so it has its own short deadline.
func (n *Node) withdrawLabels(ctx context.Context) {
	if n.labels == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := n.labels.Withdraw(ctx); err != nil {
		n.log.Warn("publishing no GPU, but cannot remove the node's GPU labels", logging.Err(err), "node", n.cfg.NodeName)
	}
}
