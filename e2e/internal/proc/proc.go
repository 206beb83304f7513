// Package proc runs long-lived programs detached from the caller and finds them again
// through pid files, so a CLI can start a node in one invocation and stop it in another.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Spec describes one program to run.
type Spec struct {
	// Name labels errors and logs.
	Name string
	// Path is the program; Args excludes argv[0].
	Path string
	Args []string
	// Env is added to the caller's environment.
	Env []string
	// Binary is the program that ends up running when Path is a wrapper that execs it;
	// pid files are matched against it. Defaults to Path.
	Binary  string
	LogFile string
	PidFile string
}

// Start launches spec in its own session with output to spec.LogFile and records its pid.
// The process outlives the caller; when the caller is still around at exit it reaps it.
func Start(spec Spec) (int, error) {
	logf, err := os.OpenFile(spec.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("open %s log: %w", spec.Name, err)
	}
	defer logf.Close()
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = append(os.Environ(), spec.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// A new session keeps terminal signals (Ctrl-C on `up`) away from the node.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s (%s): %w", spec.Name, spec.Path, err)
	}
	go func() { _ = cmd.Wait() }()
	binary := spec.Binary
	if binary == "" {
		binary = spec.Path
	}
	record := fmt.Sprintf("%d\n%s\n", cmd.Process.Pid, binary)
	if err := os.WriteFile(spec.PidFile, []byte(record), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return 0, fmt.Errorf("write %s pid file: %w", spec.Name, err)
	}
	return cmd.Process.Pid, nil
}

// Find returns the live process recorded in pidFile, or 0 when none is running.
// A recycled pid running another program does not count.
func Find(pidFile string) (int, error) {
	data, err := os.ReadFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read pid file: %w", err)
	}
	fields := strings.Split(strings.TrimSpace(string(data)), "\n")
	pid, err := strconv.Atoi(fields[0])
	if err != nil || len(fields) != 2 {
		return 0, fmt.Errorf("pid file %s is malformed: remove it", pidFile)
	}
	if !Running(pid, fields[1]) {
		return 0, nil
	}
	return pid, nil
}

// Running reports whether pid is alive (not a zombie) and runs binary.
func Running(pid int, binary string) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may itself contain spaces.
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
		return false
	}
	if binary == "" {
		return true
	}
	argv0, ok := argv0(pid)
	return ok && argv0 == binary
}

// argv0 reads pid's program name. Start returns once the exec has closed
// its close-on-exec files, which the kernel does before it lays out the new
// argv: for that moment the cmdline reads empty, so an empty one is read
// again for a short while before it counts.
func argv0(pid int) (string, bool) {
	for try := 0; ; try++ {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			return "", false
		}
		if len(cmdline) > 0 || try == 50 {
			argv0, _, _ := bytes.Cut(cmdline, []byte{0})
			return string(argv0), true
		}
		time.Sleep(time.Millisecond)
	}
}

// Stop sends SIGTERM to the process in pidFile, waits up to grace, then kills its
// process group. It removes the pid file once the process is gone.
func Stop(ctx context.Context, pidFile string, grace time.Duration) error {
	pid, err := Find(pidFile)
	if err != nil {
		return err
	}
	if pid != 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		if !waitGone(ctx, pid, grace) {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			if !waitGone(ctx, pid, 10*time.Second) {
				return fmt.Errorf("pid %d survived SIGKILL: check it with ps and kill it by hand", pid)
			}
		}
	}
	if err := os.Remove(pidFile); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove pid file: %w", err)
	}
	return nil
}

// Kill sends SIGKILL to pid and waits for it to go away.
func Kill(ctx context.Context, pid int) bool {
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return waitGone(ctx, pid, 10*time.Second)
}

func waitGone(ctx context.Context, pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if !Running(pid, "") {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return !Running(pid, "")
}
