package nodelabels

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/kubehttp"
	"github.com/nvinject/nvinject/shared/logging"
)

// Nodes is what the publisher needs of the API server: a Node's UID, and
// a forced server-side apply of its labels under contract.NodeLabelManager
// with that UID as precondition. NewREST serves it over shared/kubehttp;
// typednodes adapts a typed client (nvinject-dra has one).
type Nodes interface {
	UID(ctx context.Context, name string) (string, error)
	ApplyLabels(ctx context.Context, name, uid string, labels map[string]string) error
}

// Publisher applies a label set to one Node under contract.NodeLabelManager:
// the labels it applied before and leaves out now are removed by the API
// server, and the other kubelet plugin, applying under the same manager
// after a node move, takes them over.
type Publisher struct {
	nodes      Nodes
	node       string
	log        *slog.Logger
	first, max time.Duration
	onApply    func(error)
}

// Option configures a Publisher.
type Option func(*Publisher)

// WithLogger sets where failed applies are reported.
func WithLogger(l *slog.Logger) Option { return func(p *Publisher) { p.log = l } }

// WithBackoff sets the first and the longest wait between failed applies
// (default 1 s doubling to 5 min; tests shorten them).
func WithBackoff(first, most time.Duration) Option {
	return func(p *Publisher) { p.first, p.max = first, most }
}

// WithOnApply is called after every apply with its error (nil on success):
// the node's metric.
func WithOnApply(f func(error)) Option { return func(p *Publisher) { p.onApply = f } }

// New returns the publisher of node's labels through nodes.
func New(nodes Nodes, node string, opts ...Option) *Publisher {
	p := &Publisher{nodes: nodes, node: node, log: slog.Default(), first: time.Second, max: 5 * time.Minute, onApply: func(error) {}}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Publish applies labels, retrying with backoff until one apply succeeds
// or ctx ends; it returns the last error then, nil once applied.
func (p *Publisher) Publish(ctx context.Context, labels map[string]string) error {
	wait := p.first
	for {
		err := p.apply(ctx, labels)
		p.onApply(err)
		if err == nil {
			p.log.Info("node labels published", "node", p.node, "field_manager", contract.NodeLabelManager, "labels", len(labels))
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		p.log.Error("cannot publish the node's GPU labels; GPUs are still served, only label selectors miss this node; retrying",
			logging.Err(err), "node", p.node, "retry_in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, p.max)
	}
}

// Withdraw applies the empty set once: the node's GPU labels go.
func (p *Publisher) Withdraw(ctx context.Context) error {
	err := p.apply(ctx, nil)
	p.onApply(err)
	return err
}

// apply applies labels to the Node as it is now: an apply creates what
// does not exist, so the Node's UID is a precondition and a wrong
// --node-name never creates a Node.
func (p *Publisher) apply(ctx context.Context, labels map[string]string) error {
	const fix = "check --node-name (NODE_NAME from the downward API) and that the plugin's service account may get and patch nodes (its ClusterRole), or set --node-labels=false"
	uid, err := p.nodes.UID(ctx, p.node)
	if err != nil {
		return fmt.Errorf("read Node %s to label it: %w; %s", p.node, err, fix)
	}
	if err := p.nodes.ApplyLabels(ctx, p.node, uid, labels); err != nil {
		return fmt.Errorf("apply %d GPU labels to Node %s (field manager %s): %w; %s", len(labels), p.node, contract.NodeLabelManager, err, fix)
	}
	return nil
}

// Client is the Nodes of the API server kubeconfig names, or of the pod's
// service account (in) when it is empty; program is the user agent.
func Client(kubeconfig string, in kubehttp.InCluster, program string) (Nodes, error) {
	c, err := kubehttp.New(kubeconfig, in, program)
	if err != nil {
		return nil, err
	}
	return NewREST(c), nil
}
