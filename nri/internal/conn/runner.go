// Package conn keeps an NRI plugin registered with the runtime: it connects,
// and reconnects whenever the runtime closes the connection.
package conn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"

	"github.com/nvinject/nvinject/nri/internal/metrics"
	"github.com/nvinject/nvinject/shared/fswatch"
)

// Plugin is what a Runner keeps registered: an NRI stub plugin (the stub
// subscribes it to the events whose methods it has) with the two events a
// fail-closed GPU check needs, whose requests may outlive their connection.
type Plugin interface {
	stub.CreateContainerInterface
	stub.ValidateContainerAdjustmentInterface
	// Wait waits for requests still running after the runtime stopped
	// waiting for them.
	Wait()
}

// Runner keeps a Plugin registered with the runtime's NRI. The NRI stub
// connects once; when containerd restarts the connection closes, so Runner
// makes a new stub and connects again until its context ends: as soon as
// the socket is there again (a watch on its directory, shared/fswatch),
// and otherwise with a backoff from minRetry up to the retry interval.
type Runner struct {
	plugin    Plugin
	name      string
	idx       string
	socket    string
	retry     time.Duration
	log       *slog.Logger
	metrics   *metrics.Metrics
	connected atomic.Bool
	// drop takes a Reconnect's time away; dropping: one is pending.
	drop     chan time.Duration
	dropping atomic.Bool
}

// Option configures a Runner.
type Option func(*Runner)

// WithRetryInterval sets the longest pause between connection attempts
// while no socket event arrives (default 1s).
func WithRetryInterval(d time.Duration) Option { return func(r *Runner) { r.retry = d } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(r *Runner) { r.log = l } }

// WithMetrics records the connection state.
func WithMetrics(m *metrics.Metrics) Option { return func(r *Runner) { r.metrics = m } }

// New returns a Runner registering p as name at index idx on socket.
func New(p Plugin, name, idx, socket string, opts ...Option) *Runner {
	r := &Runner{plugin: p, name: name, idx: idx, socket: socket, retry: time.Second, log: slog.Default(), drop: make(chan time.Duration, 1)}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Ready is nil while registered with the runtime.
func (r *Runner) Ready() error {
	if !r.connected.Load() {
		return fmt.Errorf("not registered with NRI at %s", r.socket)
	}
	return nil
}

// minRetry is the first pause after a failed attempt: a socket that was just
// created may not listen yet.
const minRetry = time.Millisecond

// Run connects and reconnects until ctx ends. It fails only on a
// configuration error that no retry can fix.
func (r *Runner) Run(ctx context.Context) error {
	defer r.plugin.Wait()
	socket := filepath.Clean(r.socket)
	watch, err := fswatch.Start(ctx, []string{filepath.Dir(socket)}, fswatch.WithLogger(r.log.With("watch", "NRI socket directory")),
		fswatch.WithFilter(func(p string) bool { return p == socket }))
	if err != nil {
		return fmt.Errorf("watch the NRI socket's directory %s: %w", filepath.Dir(socket), err)
	}
	defer watch.Close()
	backoff := minRetry
	for {
		closed := make(chan struct{})
		var once sync.Once
		s, err := stub.New(r.plugin,
			stub.WithPluginName(r.name), stub.WithPluginIdx(r.idx), stub.WithSocketPath(r.socket),
			stub.WithLogger(nriLogger{r.log}),
			stub.WithOnClose(func() { once.Do(func() { close(closed) }) }))
		if err != nil {
			return fmt.Errorf("NRI plugin %s-%s: %w; check --plugin-name and --plugin-idx (two digits)", r.idx, r.name, err)
		}
		if err := s.Start(ctx); err != nil {
			r.log.Warn("cannot register with NRI; retrying when the socket appears", "socket", r.socket, "error", err.Error(), "retry_in", backoff.String())
			if !r.awaitRetry(ctx, watch.Changes(), socket, &backoff) {
				return nil
			}
			continue
		}
		backoff = minRetry
		r.setConnected(true)
		r.log.Info("registered with NRI", "socket", r.socket, "plugin", r.idx+"-"+r.name)
		select {
		case <-ctx.Done():
			s.Stop()
			r.setConnected(false)
			return nil
		case <-closed:
			r.setConnected(false)
			r.log.Warn("runtime closed the NRI connection; reconnecting", "socket", r.socket)
		case d := <-r.drop:
			s.Stop()
			r.setConnected(false)
			r.dropping.Store(false)
			r.log.Warn("dropped the NRI connection on request; reconnecting later", "socket", r.socket, "reconnect_in", d.String())
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(d):
			}
		}
	}
}

// awaitRetry waits out backoff, doubling it, or resets it and returns as
// soon as a change shows the socket there; false when ctx ends.
func (r *Runner) awaitRetry(ctx context.Context, changes <-chan fswatch.Change, socket string, backoff *time.Duration) bool {
	timer := time.NewTimer(*backoff)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-changes:
			// A removal is a change too: retry only for a socket.
			if _, err := os.Stat(socket); err == nil {
				*backoff = minRetry
				return true
			}
		case <-timer.C:
			*backoff = min(2**backoff, r.retry)
			return true
		}
	}
}

// Reconnect drops the current NRI connection and connects again d later.
// The simulation's disconnect route uses it to play a plugin that lost its
// connection.
func (r *Runner) Reconnect(d time.Duration) error {
	if !r.connected.Load() {
		return fmt.Errorf("not connected to NRI at %s", r.socket)
	}
	if !r.dropping.CompareAndSwap(false, true) {
		return errors.New("a reconnect is already pending")
	}
	r.drop <- d
	return nil
}

func (r *Runner) setConnected(up bool) {
	r.connected.Store(up)
	if r.metrics != nil {
		r.metrics.Connected(up)
	}
}

// nriLogger routes the NRI library's own messages to slog. Its Info
// messages narrate every connection step, so they go out at debug level.
type nriLogger struct{ l *slog.Logger }

func (n nriLogger) Debugf(ctx context.Context, f string, a ...any) {
	n.l.DebugContext(ctx, fmt.Sprintf(f, a...), "source", "nri")
}
func (n nriLogger) Infof(ctx context.Context, f string, a ...any) {
	n.l.DebugContext(ctx, fmt.Sprintf(f, a...), "source", "nri")
}
func (n nriLogger) Warnf(ctx context.Context, f string, a ...any) {
	n.l.WarnContext(ctx, fmt.Sprintf(f, a...), "source", "nri")
}
func (n nriLogger) Errorf(ctx context.Context, f string, a ...any) {
	n.l.ErrorContext(ctx, fmt.Sprintf(f, a...), "source", "nri")
}

var _ nrilog.Logger = nriLogger{}
