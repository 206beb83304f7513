// Package kubelet serves the DevicePlugin service on the plugin's socket in
// kubelet's device plugin directory and keeps it registered: it registers
// when kubelet.sock appears, retries with backoff while kubelet does not
// answer, and re-registers when kubelet restarts (kubelet.sock re-created)
// or the plugin's own socket is removed. It learns of both through
// inotify (fsnotify) on the directory, with a poll as the fallback: every
// second while the watch works, every 100 ms while it cannot be set up.
// Re-registering touches only the socket; the service and everything
// behind it stay as they are.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/shared/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Registrar serves and registers one device plugin.
type Registrar struct {
	dir, socket, resource string
	svc                   pluginapi.DevicePluginServer
	stopSvc               func()
	poll                  time.Duration
	noWatch               bool
	backoffMin            time.Duration
	backoffMax            time.Duration
	timeout               time.Duration
	onRegister            func(error)
	log                   *slog.Logger
	registered            atomic.Bool
}

// Option configures a Registrar.
type Option func(*Registrar)

// WithPoll sets how often the sockets are checked while the directory
// watch works (default 1 s); without it they are checked at least every
// 100 ms.
func WithPoll(d time.Duration) Option { return func(r *Registrar) { r.poll = d } }

// WithoutWatch leaves out the directory watch: the poll alone notices a
// restarted kubelet, as on a node where inotify cannot be set up. Tests
// and benchmarks compare the two.
func WithoutWatch() Option { return func(r *Registrar) { r.noWatch = true } }

// fallbackPoll is the longest poll while the directory is not watched.
const fallbackPoll = 100 * time.Millisecond

// WithBackoff bounds the wait between failed Register calls to one kubelet
// (default 10 ms doubling to 10 s: the first retries are quick because a
// Register sent the instant kubelet.sock appears can find it bound but not
// yet listening).
func WithBackoff(minWait, maxWait time.Duration) Option {
	return func(r *Registrar) { r.backoffMin, r.backoffMax = minWait, maxWait }
}

// WithOnRegister is called after every Register attempt with its result.
func WithOnRegister(f func(error)) Option { return func(r *Registrar) { r.onRegister = f } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(r *Registrar) { r.log = l } }

// WithStopService is called at shutdown before the gRPC server stops, to
// end long-lived streams.
func WithStopService(f func()) Option { return func(r *Registrar) { r.stopSvc = f } }

// New returns a Registrar for svc, serving dir/socket for resource.
func New(dir, socket, resource string, svc pluginapi.DevicePluginServer, opts ...Option) *Registrar {
	r := &Registrar{
		dir: dir, socket: socket, resource: resource, svc: svc, stopSvc: func() {},
		poll: time.Second, backoffMin: 10 * time.Millisecond, backoffMax: 10 * time.Second,
		timeout: 5 * time.Second, onRegister: func(error) {}, log: slog.Default(),
	}
	for _, o := range opts {
		o(r)
	}
	return r
}

// Registered reports whether the current kubelet accepted the plugin.
func (r *Registrar) Registered() bool { return r.registered.Load() }

// Endpoint is the plugin socket's path.
func (r *Registrar) Endpoint() string { return filepath.Join(r.dir, r.socket) }

func (r *Registrar) kubeletSocket() string { return filepath.Join(r.dir, "kubelet.sock") }

// fileID tells a re-created file from the old one even if the inode
// number is reused.
type fileID struct {
	dev, ino uint64
	ctime    int64
}

func statID(p string) (fileID, bool) {
	fi, err := os.Stat(p)
	if err != nil {
		return fileID{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim.Nano()}, true
}

// Run serves and keeps the plugin registered until ctx ends, then stops
// the streams and the server and removes the socket.
func (r *Registrar) Run(ctx context.Context) error {
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, r.svc)
	var serving sync.WaitGroup
	var ln net.Listener
	var own fileID
	var lastListenErr string

	var (
		registeredTo fileID
		haveReg      bool
		attemptedTo  fileID
		nextAttempt  time.Time
		backoff      = r.backoffMin
		kubeletGone  bool
	)
	var watch *dirWatch
	var wake <-chan struct{}
	defer func() {
		if watch != nil {
			watch.close()
		}
	}()
	lastWatchErr := ""
	var retry <-chan time.Time
	tick := time.NewTicker(min(r.poll, fallbackPoll))
	defer tick.Stop()
	for {
		if watch == nil && !r.noWatch {
			w, err := watchDir(r.dir, filepath.Base(r.kubeletSocket()), r.socket)
			switch {
			case err == nil:
				watch, wake = w, w.wake
				tick.Reset(r.poll)
				lastWatchErr = ""
			case err.Error() != lastWatchErr:
				r.log.Warn("cannot watch kubelet's device plugin directory; polling it instead", "dir", r.dir, "error", err, "poll", min(r.poll, fallbackPoll))
				lastWatchErr = err.Error()
			}
		}
		if id, ok := statID(r.Endpoint()); ln == nil || !ok || id != own {
			if ln != nil {
				r.log.Warn("plugin socket removed or replaced; serving on a new one and re-registering", "socket", r.Endpoint())
				_ = ln.Close()
				ln = nil
			}
			haveReg = false
			r.registered.Store(false)
			newLn, id, err := r.listen()
			switch {
			case err != nil:
				if err.Error() != lastListenErr {
					r.log.Error("cannot serve the plugin socket; retrying", logging.Err(err))
					lastListenErr = err.Error()
				}
			default:
				lastListenErr = ""
				ln, own = newLn, id
				serving.Add(1)
				go func() { defer serving.Done(); _ = srv.Serve(newLn) }()
				r.log.Info("serving device plugin", "socket", r.Endpoint())
			}
		}

		kid, present := statID(r.kubeletSocket())
		switch {
		case !present:
			if !kubeletGone {
				r.log.Info("kubelet registration socket absent; waiting for kubelet", "socket", r.kubeletSocket())
				kubeletGone = true
			}
			haveReg = false
			r.registered.Store(false)
		case ln != nil && (!haveReg || registeredTo != kid):
			kubeletGone = false
			if attemptedTo != kid {
				// A new kubelet: register at once, with a fresh backoff.
				attemptedTo, backoff, nextAttempt = kid, r.backoffMin, time.Time{}
			}
			if time.Now().Before(nextAttempt) {
				break
			}
			err := r.register(ctx)
			if err == nil {
				registeredTo, haveReg = kid, true
				r.registered.Store(true)
				r.log.Info("registered with kubelet", "resource", r.resource, "endpoint", r.socket)
			} else if ctx.Err() == nil {
				haveReg = false
				r.registered.Store(false)
				nextAttempt = time.Now().Add(backoff)
				retry = time.After(backoff)
				r.log.Warn("register with kubelet failed; retrying", logging.Err(err), "retry_in", backoff)
				backoff = min(2*backoff, r.backoffMax)
			}
			r.onRegister(err)
		}

		select {
		case <-ctx.Done():
			r.shutdown(srv, ln, own)
			serving.Wait()
			return nil
		case <-tick.C:
		case <-wake:
		case <-retry:
		}
	}
}

// listen replaces any stale file at the socket path with a new socket.
func (r *Registrar) listen() (net.Listener, fileID, error) {
	p := r.Endpoint()
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fileID{}, fmt.Errorf("remove stale plugin socket %s: %w; check the permissions of --kubelet-dir", p, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		return nil, fileID{}, fmt.Errorf("listen on %s: %w; check that --kubelet-dir exists and is writable (mount kubelet's device-plugins directory)", p, err)
	}
	// The path is removed here only while it is still this listener's, so
	// closing an old listener never deletes a successor's socket.
	ln.SetUnlinkOnClose(false)
	id, ok := statID(p)
	if !ok {
		_ = ln.Close()
		return nil, fileID{}, fmt.Errorf("plugin socket %s vanished right after it was created", p)
	}
	return ln, id, nil
}

func (r *Registrar) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+r.kubeletSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to kubelet at %s: %w", r.kubeletSocket(), err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     r.socket,
		ResourceName: r.resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet at %s: %w", r.resource, r.kubeletSocket(), err)
	}
	return nil
}

func (r *Registrar) shutdown(srv *grpc.Server, ln net.Listener, own fileID) {
	r.registered.Store(false)
	r.stopSvc()
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	if ln != nil {
		// Remove the socket only if it is still ours, not a successor's.
		if id, ok := statID(r.Endpoint()); ok && id == own {
			_ = os.Remove(r.Endpoint())
		}
	}
	r.log.Info("device plugin stopped", "socket", r.Endpoint())
}
