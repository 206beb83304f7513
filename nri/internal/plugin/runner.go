package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"

	"github.com/nvinject/nvinject/nri/internal/metrics"
)

// Runner keeps the handler registered with the runtime's NRI. The NRI stub
// connects once; when containerd restarts the connection closes, so Runner
// makes a new stub and connects again until its context ends.
type Runner struct {
	handler   *Handler
	name      string
	idx       string
	socket    string
	retry     time.Duration
	log       *slog.Logger
	metrics   *metrics.Metrics
	connected atomic.Bool
}

// RunnerOption configures a Runner.
type RunnerOption func(*Runner)

// WithRetryInterval sets the pause between connection attempts (default 1s).
func WithRetryInterval(d time.Duration) RunnerOption { return func(r *Runner) { r.retry = d } }

// WithRunnerLogger sets the logger.
func WithRunnerLogger(l *slog.Logger) RunnerOption { return func(r *Runner) { r.log = l } }

// WithRunnerMetrics records the connection state.
func WithRunnerMetrics(m *metrics.Metrics) RunnerOption { return func(r *Runner) { r.metrics = m } }

// NewRunner returns a Runner registering h as name at index idx on socket.
func NewRunner(h *Handler, name, idx, socket string, opts ...RunnerOption) *Runner {
	r := &Runner{handler: h, name: name, idx: idx, socket: socket, retry: time.Second, log: slog.Default()}
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

// Run connects and reconnects until ctx ends. It fails only on a
// configuration error that no retry can fix.
func (r *Runner) Run(ctx context.Context) error {
	for {
		closed := make(chan struct{})
		var once sync.Once
		s, err := stub.New(r.handler,
			stub.WithPluginName(r.name), stub.WithPluginIdx(r.idx), stub.WithSocketPath(r.socket),
			stub.WithLogger(nriLogger{r.log}),
			stub.WithOnClose(func() { once.Do(func() { close(closed) }) }))
		if err != nil {
			return fmt.Errorf("NRI plugin %s-%s: %w; check --plugin-name and --plugin-idx (two digits)", r.idx, r.name, err)
		}
		if err := s.Start(ctx); err != nil {
			r.log.Warn("cannot register with NRI; retrying", "socket", r.socket, "error", err.Error(), "retryIn", r.retry.String())
			if !sleep(ctx, r.retry) {
				return nil
			}
			continue
		}
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
		}
	}
}

func (r *Runner) setConnected(up bool) {
	r.connected.Store(up)
	if r.metrics != nil {
		r.metrics.Connected(up)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
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
