package injbench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// daemon is a long-running child process (containerd, nvinject-nri) with
// its output in a log file.
type daemon struct {
	name, logFile string
	cmd           *exec.Cmd
	done          chan struct{}
	err           error
}

// startDaemon runs path with args in its own process group, so stopping it
// never signals the benchmark itself.
func startDaemon(name, logFile string, env []string, path string, args ...string) (*daemon, error) {
	logf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, path, err)
	}
	d := &daemon{name: name, logFile: logFile, cmd: cmd, done: make(chan struct{})}
	go func() { d.err = cmd.Wait(); close(d.done) }()
	return d, nil
}

// exited reports an error once the process has ended.
func (d *daemon) exited() error {
	select {
	case <-d.done:
		return fmt.Errorf("%s exited (%v); see %s", d.name, d.err, d.logFile)
	default:
		return nil
	}
}

// stop sends SIGTERM, then SIGKILL to the process group after grace.
func (d *daemon) stop(ctx context.Context, log *slog.Logger, grace time.Duration) error {
	if d == nil {
		return nil
	}
	select {
	case <-d.done:
		return nil
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-d.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	log.Warn("daemon ignored SIGTERM; killing its process group", "daemon", d.name, "pid", d.cmd.Process.Pid)
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-d.done:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New(d.name + " survived SIGKILL: find it with ps and kill it by hand")
	}
}

// poll calls check every 100ms until it succeeds, d exits or timeout passes.
func poll(ctx context.Context, d *daemon, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if exitErr := d.exited(); exitErr != nil {
			return exitErr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s (see %s): %w", d.name, timeout, d.logFile, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
