package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	nrilog "github.com/containerd/nri/pkg/log"
	"github.com/containerd/nri/pkg/stub"
	"github.com/fsnotify/fsnotify"

	"github.com/nvinject/nvinject/nri/internal/metrics"
)

// Runner keeps the handler registered with the runtime's NRI. The NRI stub
// connects once; when containerd restarts the connection closes, so Runner
// makes a new stub and connects again until its context ends: as soon as
// the socket is created again (a watch on its directory), and otherwise
// with a backoff from minRetry up to the retry interval.
type Runner struct {
	handler   *Handler
	name      string
	idx       string
	socket    string
	retry     time.Duration
	log       *slog.Logger
	metrics   *metrics.Metrics
	connected atomic.Bool
	drop      chan time.Duration
}

// RunnerOption configures a Runner.
type RunnerOption func(*Runner)

// WithRetryInterval sets the longest pause between connection attempts
// while no socket event arrives (default 1s).
func WithRetryInterval(d time.Duration) RunnerOption { return func(r *Runner) { r.retry = d } }

// WithRunnerLogger sets the logger.
func WithRunnerLogger(l *slog.Logger) RunnerOption { return func(r *Runner) { r.log = l } }

// WithRunnerMetrics records the connection state.
func WithRunnerMetrics(m *metrics.Metrics) RunnerOption { return func(r *Runner) { r.metrics = m } }

// NewRunner returns a Runner registering h as name at index idx on socket.
func NewRunner(h *Handler, name, idx, socket string, opts ...RunnerOption) *Runner {
	r := &Runner{handler: h, name: name, idx: idx, socket: socket, retry: time.Second, log: slog.Default(), drop: make(chan time.Duration, 1)}
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
	defer r.handler.Wait()
	var watcher sync.WaitGroup
	defer watcher.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	appeared := r.watchSocket(ctx, &watcher)
	backoff := minRetry
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
			r.log.Warn("cannot register with NRI; retrying when the socket appears", "socket", r.socket, "error", err.Error(), "retry_in", backoff.String())
			select {
			case <-ctx.Done():
				return nil
			case <-appeared:
				backoff = minRetry
			case <-time.After(backoff):
				backoff = min(2*backoff, r.retry)
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
			r.log.Warn("SIMULATED disconnect from NRI", "socket", r.socket, "reconnect_in", d.String())
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(d):
			}
		}
	}
}

// SimDisconnect drops the NRI connection and stays away for d before
// reconnecting. SIMULATION ONLY: the fault tests use it to play a plugin
// that lost its connection; the command serves it only with simulated GPUs.
func (r *Runner) SimDisconnect(d time.Duration) error {
	if !r.connected.Load() {
		return fmt.Errorf("not connected to NRI at %s", r.socket)
	}
	select {
	case r.drop <- d:
		return nil
	default:
		return fmt.Errorf("a simulated disconnect is already pending")
	}
}

func (r *Runner) setConnected(up bool) {
	r.connected.Store(up)
	if r.metrics != nil {
		r.metrics.Connected(up)
	}
}

// watchSocket signals each creation of the socket until ctx ends. Without
// a watch (the directory is missing, or inotify is unavailable) the channel
// never fires and the backoff alone paces the attempts.
func (r *Runner) watchSocket(ctx context.Context, wg *sync.WaitGroup) <-chan struct{} {
	out := make(chan struct{}, 1)
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(filepath.Dir(r.socket)); err != nil {
			w.Close()
		}
	}
	if err != nil {
		r.log.Warn("cannot watch the NRI socket's directory; reconnecting on a timer only", "socket", r.socket, "error", err.Error())
		return out
	}
	socket := filepath.Clean(r.socket)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer w.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Name == socket && ev.Has(fsnotify.Create) {
					select {
					case out <- struct{}{}:
					default:
					}
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
			}
		}
	}()
	return out
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
