// Package mps runs NVIDIA's MPS control daemons for the GPUs a node shares
// through MPS: one nvidia-cuda-mps-control per shared GPU or MIG device,
// from the node's driver root, in the foreground so that the node owns,
// supervises and stops it. Each daemon gets its default limits (active
// thread percentage, pinned device memory) through its control pipe once it
// listens, and is restarted with backoff if it exits. The set of daemons is
// declared (Sync) and reconciled: a daemon that stays wanted keeps running,
// and with it its clients, across a republish.
package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
)

// ControlBinary is NVIDIA's MPS control program, in the driver root's
// binaries (cdi/driver's Binaries).
const ControlBinary = "nvidia-cuda-mps-control"

// Daemon is one wanted MPS control daemon.
type Daemon struct {
	// ID names the daemon's directory: the shared GPU's or MIG device's UUID.
	ID string
	// Visible is CUDA_VISIBLE_DEVICES for the daemon and its server: the
	// shared GPUs' or MIG devices' UUIDs (comma list), so its clients reach
	// those devices only.
	Visible string
	// ActiveThreadPercentage is each client's default share of the SMs
	// (1..100).
	ActiveThreadPercentage int
	// PinnedMemoryMiB is each client's default memory limit on each of the
	// daemon's devices (0: none).
	PinnedMemoryMiB uint64
}

// Devices is how many devices the daemon's clients see: CUDA numbers them
// 0..Devices-1 in Visible's order.
func (d Daemon) Devices() int { return strings.Count(d.Visible, ",") + 1 }

// Paths are a daemon's directories under the root; on the host they are
// the same paths (the DaemonSet mounts the root at its host path).
type Paths struct {
	Dir, Pipe, Log string
}

// Control is the daemon's control socket, which clients and the doctor dial.
func (p Paths) Control() string { return filepath.Join(p.Pipe, "control") }

// PathsOf returns the directories of daemon id under root.
func PathsOf(root, id string) Paths {
	dir := filepath.Join(root, id)
	return Paths{Dir: dir, Pipe: filepath.Join(dir, "pipe"), Log: filepath.Join(dir, "log")}
}

// validID reports whether id can name a directory under root by itself.
func validID(id string) bool {
	return id != "" && id != "." && id != ".." && len(id) <= 255 && !strings.ContainsAny(id, "/\x00")
}

// ShmDir is the shared memory directory of every daemon under root: the
// daemons' /dev/shm (the DaemonSet mounts it there) and their clients'.
func ShmDir(root string) string { return filepath.Join(root, "shm") }

// Program is the control program a Manager runs: the driver root's
// nvidia-cuda-mps-control and the env it needs there (LD_LIBRARY_PATH to
// the root's libraries, which its server dlopens).
type Program struct {
	Path string
	Env  []string
}

// Manager runs the wanted daemons.
type Manager struct {
	root    string
	log     *slog.Logger
	backoff time.Duration
	ready   time.Duration

	mu      sync.Mutex
	program Program
	want    map[string]Daemon
	state   map[string]string // id -> why not ready; "" when ready
	changed chan struct{}
}

// Option configures a Manager.
type Option func(*Manager)

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(m *Manager) { m.log = l } }

// WithRestartBackoff sets the first wait before restarting an exited
// daemon (default 1 s, doubling to 30 s).
func WithRestartBackoff(d time.Duration) Option { return func(m *Manager) { m.backoff = d } }

// WithReadyTimeout bounds how long a started daemon may take to listen
// (default 10 s) before it is stopped and restarted.
func WithReadyTimeout(d time.Duration) Option { return func(m *Manager) { m.ready = d } }

// New returns a Manager for daemons under root.
func New(root string, opts ...Option) *Manager {
	m := &Manager{root: root, log: slog.Default(), backoff: time.Second, ready: 10 * time.Second,
		want: map[string]Daemon{}, state: map[string]string{}, changed: make(chan struct{}, 1)}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Sync declares the wanted daemons and the program they run. Daemons no
// longer wanted, or wanted with other settings or another program, are
// stopped (and the latter started again); the others keep running.
func (m *Manager) Sync(p Program, ds []Daemon) {
	m.mu.Lock()
	m.program = p
	m.want = map[string]Daemon{}
	for _, d := range ds {
		if !validID(d.ID) {
			// The ID names the daemon's directories under root.
			m.log.Error("MPS daemon not started: its ID is not a single file name", "daemon", contract.Quote(d.ID))
			continue
		}
		m.want[d.ID] = d
		if _, ok := m.state[d.ID]; !ok {
			m.state[d.ID] = "starting"
		}
	}
	for id := range m.state {
		if _, ok := m.want[id]; !ok {
			delete(m.state, id)
		}
	}
	m.mu.Unlock()
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// Ready is nil when every wanted daemon listens with its limits set, else
// it names those that do not and why.
func (m *Manager) Ready() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for id, why := range m.state {
		if why != "" {
			out = append(out, id+": "+why)
		}
	}
	if len(out) == 0 {
		return nil
	}
	slices.Sort(out)
	return fmt.Errorf("MPS control daemon not ready: %s", strings.Join(out, "; "))
}

// Wait returns once daemon id listens with its limits set, or says why it
// does not when ctx ends (or at once when id is not wanted).
func (m *Manager) Wait(ctx context.Context, id string) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		m.mu.Lock()
		why, wanted := m.state[id]
		m.mu.Unlock()
		switch {
		case !wanted:
			return fmt.Errorf("MPS control daemon %s is not wanted", id)
		case why == "":
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("MPS control daemon %s not ready (%s): %w", id, why, ctx.Err())
		case <-t.C:
		}
	}
}

func (m *Manager) setState(id, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.want[id]; ok {
		m.state[id] = why
	}
}

// Run reconciles the daemons until ctx ends, then stops them all and
// returns once every one has exited.
func (m *Manager) Run(ctx context.Context) error {
	type running struct {
		d      Daemon
		p      string
		cancel context.CancelFunc
		done   chan struct{}
	}
	live := map[string]*running{}
	stop := func(r *running) {
		r.cancel()
		<-r.done
	}
	defer func() {
		for _, r := range live {
			stop(r)
		}
	}()
	for {
		m.mu.Lock()
		want := make(map[string]Daemon, len(m.want))
		for id, d := range m.want {
			want[id] = d
		}
		prog := m.program
		m.mu.Unlock()
		key := prog.Path + "\x00" + strings.Join(prog.Env, "\x00")
		for id, r := range live {
			if d, ok := want[id]; !ok || d != r.d || r.p != key {
				stop(r)
				delete(live, id)
			}
		}
		for id, d := range want {
			if _, ok := live[id]; ok {
				continue
			}
			dctx, cancel := context.WithCancel(ctx)
			r := &running{d: d, p: key, cancel: cancel, done: make(chan struct{})}
			live[id] = r
			go func() {
				defer close(r.done)
				m.supervise(dctx, prog, d)
			}()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.changed:
		}
	}
}

// supervise keeps one daemon running until ctx ends.
func (m *Manager) supervise(ctx context.Context, prog Program, d Daemon) {
	wait := m.backoff
	for {
		started := time.Now()
		err := m.runOnce(ctx, prog, d)
		if ctx.Err() != nil {
			return
		}
		m.setState(d.ID, fmt.Sprintf("exited (%v); restarting in %s", err, wait))
		m.log.Error("MPS control daemon exited; its clients lose the GPU until it is back, restarting", "daemon", d.ID, "error", err, "restart_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if time.Since(started) > time.Minute {
			wait = m.backoff
		} else if wait = 2 * wait; wait > 30*time.Second {
			wait = 30 * time.Second
		}
	}
}

// runOnce starts the daemon, sets its limits once it listens, and returns
// when it exits or ctx ends (after asking it to quit).
func (m *Manager) runOnce(ctx context.Context, prog Program, d Daemon) error {
	p := PathsOf(m.root, d.ID)
	for _, dir := range []string{p.Pipe, p.Log, ShmDir(m.root)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create %s: %w; --mps-dir must be writable", dir, err)
		}
	}
	// A daemon killed with its container leaves its socket behind; the
	// control program refuses to start beside it.
	for _, f := range []string{"control", "control_privileged", "control_lock", "log"} {
		if err := os.Remove(filepath.Join(p.Pipe, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove the stale %s: %w", filepath.Join(p.Pipe, f), err)
		}
	}
	cmd := exec.Command(prog.Path, "-f")
	cmd.Env = append(prog.clientEnv(p.Pipe), "CUDA_MPS_LOG_DIRECTORY="+p.Log, "CUDA_VISIBLE_DEVICES="+d.Visible)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group: a signal to the node's terminal group does
	// not reach it before the node asks it to quit.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w; the driver root needs NVIDIA's MPS binaries (Debian: nvidia-cuda-mps)", prog.Path, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ready := make(chan error, 1)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { ready <- configure(sctx, prog, p, d, m.ready) }()
	for {
		select {
		case err := <-exited:
			cancel()
			<-ready
			if o := tail(out.String()); o != "" {
				return fmt.Errorf("%w: %s", errOrExit(err), o)
			}
			return errOrExit(err)
		case err := <-ready:
			ready = nil
			if err != nil {
				m.log.Error("MPS control daemon did not take its limits; stopping it", "daemon", d.ID, "error", err)
				quit(prog, p.Pipe, cmd, exited)
				return err
			}
			m.setState(d.ID, "")
			m.log.Info("MPS control daemon ready", "daemon", d.ID, "pipe", p.Pipe, "active_thread_percentage", d.ActiveThreadPercentage, "pinned_memory_mib", d.PinnedMemoryMiB)
		case <-ctx.Done():
			cancel()
			if ready != nil {
				<-ready
			}
			quit(prog, p.Pipe, cmd, exited)
			return ctx.Err()
		}
	}
}

func errOrExit(err error) error {
	if err == nil {
		return errors.New("exited with status 0")
	}
	return err
}

// quit asks the daemon to quit through its pipe, then terminates it.
func quit(prog Program, pipe string, cmd *exec.Cmd, exited <-chan error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := prog.Command(ctx, pipe, "quit"); err == nil {
		select {
		case <-exited:
			return
		case <-time.After(5 * time.Second):
		}
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}

// configure waits for the control socket, then sets and reads back the
// daemon's default limits.
func configure(ctx context.Context, prog Program, p Paths, d Daemon, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if st, err := os.Stat(p.Control()); err == nil && st.Mode()&os.ModeSocket != 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no control socket %s after %s", p.Control(), timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	cmds := []string{fmt.Sprintf("set_default_active_thread_percentage %d", d.ActiveThreadPercentage)}
	for i := 0; d.PinnedMemoryMiB > 0 && i < d.Devices(); i++ {
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit %d %dM", i, d.PinnedMemoryMiB))
	}
	for _, c := range cmds {
		if _, err := prog.Command(ctx, p.Pipe, c); err != nil {
			return err
		}
	}
	got, err := prog.Command(ctx, p.Pipe, "get_default_active_thread_percentage")
	if err != nil {
		return err
	}
	if want := fmt.Sprintf("%d.0", d.ActiveThreadPercentage); got != want {
		return fmt.Errorf("the daemon reports an active thread percentage of %q after setting %s", got, want)
	}
	return nil
}

// Command sends one command to the daemon listening in pipe, the way an
// operator does (echo CMD | nvidia-cuda-mps-control), and returns its
// answer, trimmed.
func (prog Program) Command(ctx context.Context, pipe, c string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog.Path)
	cmd.Env = prog.clientEnv(pipe)
	cmd.Stdin = strings.NewReader(c + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("MPS control command %q: %w: %s", c, err, tail(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

func (prog Program) clientEnv(pipe string) []string {
	return append(slices.Clone(prog.Env), "CUDA_MPS_PIPE_DIRECTORY="+pipe)
}

// tail bounds a program's output in an error.
func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 512 {
		s = "…" + s[len(s)-512:]
	}
	return s
}
