// Package httpserve runs a daemon's metrics and health endpoints:
// /metrics (Prometheus), /healthz (the process serves) and /readyz (the
// daemon's own readiness check).
package httpserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyFunc returns nil when the daemon can do its job, else why not.
type ReadyFunc func() error

// Server serves the endpoints on one address.
type Server struct {
	addr  string
	mux   *http.ServeMux
	log   *slog.Logger
	ready ReadyFunc
}

// Option configures a Server.
type Option func(*Server)

// WithReady sets the readiness check behind /readyz.
func WithReady(f ReadyFunc) Option { return func(s *Server) { s.ready = f } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// New returns a server for addr exposing reg's metrics.
func New(addr string, reg prometheus.Gatherer, opts ...Option) *Server {
	s := &Server{addr: addr, mux: http.NewServeMux(), log: slog.Default(), ready: func() error { return nil }}
	for _, o := range opts {
		o(s)
	}
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, "ok")
	})
	s.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	return s
}

// Handle adds a handler, e.g. the simulation's debug endpoints.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Run listens and serves until ctx ends. An empty address disables it.
func (s *Server) Run(ctx context.Context) error {
	if s.addr == "" {
		<-ctx.Done()
		return nil
	}
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w; choose a free --metrics-addr", s.addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	s.log.Info("serving metrics and health", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics server: %w", err)
	}
	return nil
}
