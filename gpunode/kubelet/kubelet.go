// Package kubelet serves the DevicePlugin service on the plugin's socket in
// kubelet's device plugin directory and keeps it registered with exactly
// one Register per kubelet instance, whatever the order of kubelet's
// directory cleanup, its kubelet.sock's creation and the plugin's dial.
//
// kubelet 1.37 keys its plugin connections by socket path, and a second
// Register for a connected path is refused ("device plugin already
// connected") in a way that drops the live connection and refuses the path
// until kubelet restarts. So: a kubelet instance is its kubelet.sock file,
// and the Register goes through a handle on that file, recording the one it
// reached; no Register goes out while kubelet holds a ListAndWatch stream of
// the plugin; kubelet's stream gone, or the plugin's socket cleaned up
// (kubelet's start-up cleanup) with no stream of kubelet's, is a reason to
// register again;
// and a path kubelet refuses is left for a fresh socket name. Changes to
// the two sockets are seen through a watch on the directory (shared/fswatch:
// inotify, or listing it every 100 ms where it cannot be watched), and both
// are looked at every second whatever the watch says.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/shared/fswatch"
	"github.com/nvinject/nvinject/shared/logging"
)

// Registrar serves and registers one device plugin.
type Registrar struct {
	dir, base, resource string
	svc                 pluginapi.DevicePluginServer
	stopSvc             func()
	poll                time.Duration
	noWatch             bool
	backoffMin          time.Duration
	backoffMax          time.Duration
	timeout             time.Duration
	// settle is how long a closed stream waits before it counts as kubelet
	// dropping the plugin rather than kubelet stopping.
	settle     time.Duration
	onRegister func(error)
	log        *slog.Logger
	registered atomic.Bool
	// name is the socket's file name: base, or a fresh one after kubelet
	// refused base.
	name    atomic.Value
	streams streams
	// dialHook runs between opening kubelet.sock and dialing it; tests
	// replace the socket there.
	dialHook func()
}

// Option configures a Registrar.
type Option func(*Registrar)

// WithPoll sets how often the sockets are checked whatever the directory
// watch says (default 1 s); where inotify cannot watch the directory, it
// is listed at least every 100 ms.
func WithPoll(d time.Duration) Option { return func(r *Registrar) { r.poll = d } }

// WithoutWatch leaves inotify out: listing the directory alone notices a
// restarted kubelet, as on a node where inotify cannot be set up. Tests
// and benchmarks compare the two.
func WithoutWatch() Option { return func(r *Registrar) { r.noWatch = true } }

// fallbackPoll is the longest interval between listings of the directory
// while inotify does not watch it.
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
		dir: dir, base: socket, resource: resource, svc: svc, stopSvc: func() {},
		poll: time.Second, backoffMin: 10 * time.Millisecond, backoffMax: 10 * time.Second,
		timeout: 5 * time.Second, settle: time.Second, onRegister: func(error) {}, log: slog.Default(),
		streams: streams{wake: make(chan struct{}, 1)}, dialHook: func() {},
	}
	r.name.Store(socket)
	for _, o := range opts {
		o(r)
	}
	return r
}

// Registered reports whether the current kubelet accepted the plugin.
func (r *Registrar) Registered() bool { return r.registered.Load() }

// Endpoint is the plugin socket's path.
func (r *Registrar) Endpoint() string { return filepath.Join(r.dir, r.name.Load().(string)) }

func (r *Registrar) kubeletSocket() string { return filepath.Join(r.dir, "kubelet.sock") }

// fileID tells a re-created file from the old one even if the inode
// number is reused.
type fileID struct {
	dev, ino uint64
	ctime    int64
}

func idOf(st *unix.Stat_t) fileID {
	return fileID{dev: st.Dev, ino: st.Ino, ctime: st.Ctim.Nano()}
}

func statID(p string) (fileID, bool) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return fileID{}, false
	}
	return idOf(&st), true
}

// Run serves and keeps the plugin registered until ctx ends, then stops
// the streams and the server and removes the socket.
func (r *Registrar) Run(ctx context.Context) error {
	srv := r.newServer()
	var serving sync.WaitGroup
	serve := func(s *grpc.Server, ln net.Listener) {
		serving.Add(1)
		go func() { defer serving.Done(); _ = s.Serve(ln) }()
	}
	var (
		ln            net.Listener
		own           fileID
		lastListenErr string

		// The kubelet instance (its kubelet.sock) the last accepted
		// Register reached, and the streams opened before it.
		regTo     fileID
		haveReg   bool
		regOpened uint64
		lostAt    time.Time
		// cleaned: the plugin socket was removed since that Register.
		cleaned   bool
		cleanedAt time.Time

		attemptedTo fileID
		nextAttempt time.Time
		backoff     = r.backoffMin
		kubeletGone bool
		renames     int
	)
	watch, err := r.watch(ctx)
	if err != nil {
		return err
	}
	defer watch.Close()
	var retry <-chan time.Time
	tick := time.NewTicker(r.poll)
	defer tick.Stop()
	for {
		// A starting kubelet removes the plugin's socket, and a new
		// kubelet.sock may reuse the old one's inode and ctime tick: so a
		// removed socket means registering again, unless kubelet still holds
		// a stream of the plugin (then it keeps that connection, and a
		// Register would be refused).
		if id, ok := statID(r.Endpoint()); ln == nil || !ok || id != own {
			if ln != nil {
				r.log.Warn("plugin socket removed or replaced; serving on a new one", "socket", r.Endpoint())
				_ = ln.Close()
				ln = nil
				if !cleaned {
					cleaned, cleanedAt = true, time.Now()
				}
			}
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
				serve(srv, newLn)
				r.log.Info("serving device plugin", "socket", r.Endpoint())
			}
		}

		kid, present := statID(r.kubeletSocket())
		open := r.streams.open.Load()
		// After an accepted Register, kubelet has dropped the plugin when
		// the stream it opened is gone (it dropped it, or it stopped: wait
		// a moment, a stopping kubelet closes its streams before its socket
		// goes), or when the plugin's socket was cleaned up, a starting
		// kubelet's doing, and no stream of kubelet's came within that
		// moment. A new kubelet.sock may reuse the old one's inode and ctime
		// tick, so the cleanup is a signal of its own.
		lost, why := false, ""
		if haveReg && open == 0 {
			var since time.Time
			switch {
			case r.streams.opened.Load() > regOpened:
				if lostAt.IsZero() {
					lostAt = time.Now()
				}
				since, why = lostAt, "kubelet closed the plugin's ListAndWatch stream"
				if cleaned {
					since = time.Time{}
				}
			case cleaned:
				since, why = cleanedAt, "kubelet cleaned up the plugin's socket and opened no stream"
			}
			if why != "" {
				if wait := r.settle - time.Since(since); wait > 0 {
					retry = time.After(wait)
				} else {
					lost = true
				}
			}
		} else {
			lostAt = time.Time{}
		}
		switch {
		case !present:
			if !kubeletGone {
				r.log.Info("kubelet registration socket absent; waiting for kubelet", "socket", r.kubeletSocket())
				kubeletGone = true
			}
			r.registered.Store(false)
		case open > 0:
			// kubelet holds a ListAndWatch stream of this plugin: it is
			// connected, and another Register would be refused.
			kubeletGone = false
			r.registered.Store(true)
		case haveReg && regTo == kid && !lost:
			// Accepted by this kubelet; its stream is on the way.
			kubeletGone = false
		case ln == nil:
		default:
			kubeletGone = false
			if lost {
				r.log.Warn(why+"; registering again", "socket", r.Endpoint())
				haveReg, lostAt = false, time.Time{}
				r.registered.Store(false)
			}
			if attemptedTo != kid {
				// A new kubelet: register at once, with a fresh backoff.
				attemptedTo, backoff, nextAttempt = kid, r.backoffMin, time.Time{}
			}
			if time.Now().Before(nextAttempt) {
				break
			}
			before := r.streams.opened.Load()
			reached, err := r.register(ctx, own)
			switch {
			case errors.Is(err, errCleanedUp):
				// Serve the socket again before registering.
				continue
			case err == nil:
				regTo, haveReg, regOpened, lostAt, cleaned = reached, true, before, time.Time{}, false
				r.registered.Store(true)
				r.log.Info("registered with kubelet", "resource", r.resource, "endpoint", filepath.Base(r.Endpoint()))
			case ctx.Err() != nil:
			case alreadyConnected(err) && renames < maxRenames:
				renames++
				old := r.Endpoint()
				r.name.Store(renamed(r.base, renames))
				r.log.Error("kubelet refuses this plugin socket: it still holds an earlier connection of that path (kubelet's \"device plugin already connected\") and refuses the path until kubelet restarts; serving on a fresh socket name instead",
					"socket", old, "new_socket", r.Endpoint())
				// The old server's connections end with it, kubelet's
				// orphaned one among them.
				srv.Stop()
				srv = r.newServer()
				if id, ok := statID(old); ok && id == own {
					_ = os.Remove(old)
				}
				ln, haveReg, nextAttempt, backoff = nil, false, time.Time{}, r.backoffMin
				r.registered.Store(false)
				r.onRegister(err)
				continue
			default:
				haveReg = false
				r.registered.Store(false)
				nextAttempt = time.Now().Add(backoff)
				retry = time.After(backoff)
				if alreadyConnected(err) {
					r.log.Error("kubelet refuses every socket name tried as already connected; restart kubelet to clear its device manager", logging.Err(err), "retry_in", backoff)
				} else {
					r.log.Warn("register with kubelet failed; retrying", logging.Err(err), "retry_in", backoff)
				}
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
		case <-watch.Changes():
		case <-retry:
		case <-r.streams.wake:
		}
	}
}

// watch reports changes of kubelet.sock and of the plugin's socket, under
// whichever name it has now.
func (r *Registrar) watch(ctx context.Context) (*fswatch.Watcher, error) {
	opts := []fswatch.Option{fswatch.WithPoll(min(r.poll, fallbackPoll)), fswatch.WithLogger(r.log.With("watch", "kubelet's device plugin directory")),
		fswatch.WithFilter(func(p string) bool {
			b := filepath.Base(p)
			return b == filepath.Base(r.kubeletSocket()) || b == r.name.Load().(string)
		})}
	if r.noWatch {
		opts = append(opts, fswatch.PollOnly())
	}
	w, err := fswatch.Start(ctx, []string{r.dir}, opts...)
	if err != nil {
		return nil, fmt.Errorf("watch kubelet's device plugin directory %s: %w; check --kubelet-dir", r.dir, err)
	}
	return w, nil
}

// maxRenames bounds the fresh socket names one process tries.
const maxRenames = 8

// renamed is the n-th fresh socket name for base: "p.sock" -> "p-1.sock".
func renamed(base string, n int) string {
	return fmt.Sprintf("%s-%d.sock", strings.TrimSuffix(base, ".sock"), n)
}

// alreadyConnected recognises kubelet's refusal of a Register for a socket
// path its device manager still holds (pkg/kubelet/cm/devicemanager).
func alreadyConnected(err error) bool {
	return err != nil && strings.Contains(err.Error(), "device plugin already connected")
}

func (r *Registrar) newServer() *grpc.Server {
	// WaitForHandlers: after Stop, the stream count is exact.
	srv := grpc.NewServer(grpc.StatsHandler(&r.streams), grpc.UnaryInterceptor(r.streams.unary),
		grpc.StreamInterceptor(r.streams.stream), grpc.WaitForHandlers(true))
	pluginapi.RegisterDevicePluginServer(srv, r.svc)
	return srv
}

// streams counts kubelet's open ListAndWatch streams and wakes the loop
// when one opens or closes. kubelet's connection is the one that asks the
// plugin's options first while our Register is in flight (kubelet dials
// back inside its Register handler); streams of other clients, a debugging
// tool say, do not count.
type streams struct {
	open        atomic.Int64
	opened      atomic.Uint64
	registering atomic.Bool
	nextConn    atomic.Uint64
	kubelet     sync.Map // conn ID -> struct{}
	wake        chan struct{}
}

type connKey struct{}

func (s *streams) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, s.nextConn.Add(1))
}

func (s *streams) HandleConn(ctx context.Context, st stats.ConnStats) {
	if _, end := st.(*stats.ConnEnd); end {
		s.kubelet.Delete(ctx.Value(connKey{}))
	}
}

func (s *streams) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (s *streams) HandleRPC(context.Context, stats.RPCStats)                       {}

func (s *streams) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	// The first to ask during the Register is kubelet, inside its handler.
	if info.FullMethod == pluginapi.DevicePlugin_GetDevicePluginOptions_FullMethodName && s.registering.CompareAndSwap(true, false) {
		s.kubelet.Store(ctx.Value(connKey{}), struct{}{})
	}
	return h(ctx, req)
}

func (s *streams) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if _, ok := s.kubelet.Load(ss.Context().Value(connKey{})); !ok || info.FullMethod != pluginapi.DevicePlugin_ListAndWatch_FullMethodName {
		return h(srv, ss)
	}
	s.opened.Add(1)
	s.open.Add(1)
	s.signal()
	defer func() {
		s.open.Add(-1)
		s.signal()
	}()
	return h(srv, ss)
}

func (s *streams) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
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

// errCleanedUp: the plugin's socket went between the loop's look at it and
// the Register.
var errCleanedUp = errors.New("plugin socket removed before the Register")

// register sends one Register through a handle on kubelet.sock, so that it
// reaches exactly the file whose identity it returns: a kubelet.sock
// replaced between a stat and a dial by path would otherwise be recorded as
// the old one, and the next look would register a second time. own is the
// plugin socket's identity as served.
func (r *Registrar) register(ctx context.Context, own fileID) (fileID, error) {
	fd, err := unix.Open(r.kubeletSocket(), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fileID{}, fmt.Errorf("open kubelet's registration socket %s: %w", r.kubeletSocket(), err)
	}
	defer func() { _ = unix.Close(fd) }()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileID{}, fmt.Errorf("stat kubelet's registration socket %s: %w", r.kubeletSocket(), err)
	}
	// kubelet removes the plugins' sockets before it creates kubelet.sock.
	// With this kubelet.sock open, the plugin's socket still in place means
	// that kubelet's cleanup is over, and its dial back finds the socket;
	// otherwise kubelet would wait for a socket the plugin serves again only
	// after this Register.
	if id, ok := statID(r.Endpoint()); !ok || id != own {
		return fileID{}, errCleanedUp
	}
	r.dialHook()
	via := fmt.Sprintf("/proc/self/fd/%d", fd)
	conn, err := grpc.NewClient("passthrough:///kubelet.sock", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority("localhost"),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", via)
		}))
	if err != nil {
		return fileID{}, fmt.Errorf("connect to kubelet at %s: %w", r.kubeletSocket(), err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	r.streams.registering.Store(true)
	defer r.streams.registering.Store(false)
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(r.Endpoint()),
		ResourceName: r.resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fileID{}, fmt.Errorf("register %s with kubelet at %s: %w", r.resource, r.kubeletSocket(), err)
	}
	return idOf(&st), nil
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
