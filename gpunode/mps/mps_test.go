package mps

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The test binary stands in for nvidia-cuda-mps-control when
// MPS_TEST_CONTROL is set: with -f it is the daemon (a SOCK_SEQPACKET unix socket, as NVIDIA's, in
// CUDA_MPS_PIPE_DIRECTORY answering one command per connection), without
// it the client (the command on stdin, the answer on stdout). NVIDIA's real
// program is run by e2e/harness/driverroot's tests against its driver root.
func TestMain(m *testing.M) {
	if os.Getenv("MPS_TEST_CONTROL") != "" {
		os.Exit(fakeControl())
	}
	os.Exit(m.Run())
}

func fakeControl() int {
	sock := filepath.Join(os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), "control")
	if len(os.Args) > 1 && os.Args[1] == "-f" {
		if f := os.Getenv("MPS_TEST_CRASH"); f != "" {
			if _, err := os.Stat(f); err == nil {
				return 3
			}
		}
		l, err := net.Listen("unixpacket", sock)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		pct := "100.0"
		for {
			c, err := l.Accept()
			if err != nil {
				return 1
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			f := strings.Fields(line)
			switch {
			case len(f) == 2 && f[0] == "set_default_active_thread_percentage":
				pct = f[1] + ".0"
				fmt.Fprintln(c, pct)
			case len(f) == 1 && f[0] == "get_default_active_thread_percentage":
				fmt.Fprintln(c, pct)
			case len(f) == 1 && f[0] == "quit":
				c.Close()
				l.Close()
				return 0
			}
			c.Close()
		}
	}
	in, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	c, err := net.Dial("unixpacket", sock)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer c.Close()
	fmt.Fprint(c, in)
	out, _ := bufio.NewReader(c).ReadString('\n')
	fmt.Print(out)
	return 0
}

func newManager(t *testing.T, env ...string) (*Manager, Program, string) {
	t.Helper()
	for _, e := range append([]string{"MPS_TEST_CONTROL=1"}, env...) {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
	// Unix socket paths are short; t.TempDir's can be too long.
	root, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	m := New(root, WithRestartBackoff(20*time.Millisecond), WithReadyTimeout(2*time.Second))
	return m, Program{Path: self, Env: os.Environ()}, root
}

func run(t *testing.T, m *Manager) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := m.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	return func() { cancel(); wg.Wait() }
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDaemonsStartWithLimitsAndStop(t *testing.T) {
	m, prog, root := newManager(t)
	stop := run(t, m)
	m.Sync(prog, []Daemon{{ID: "GPU-a", Visible: "GPU-a", ActiveThreadPercentage: 25}, {ID: "GPU-b", Visible: "GPU-b", ActiveThreadPercentage: 50}})
	if m.Ready() == nil {
		t.Error("ready before any daemon started")
	}
	eventually(t, "both daemons ready", func() bool { return m.Ready() == nil })
	for id, want := range map[string]string{"GPU-a": "25.0", "GPU-b": "50.0"} {
		got, err := prog.Command(context.Background(), PathsOf(root, id).Pipe, "get_default_active_thread_percentage")
		if err != nil || got != want {
			t.Errorf("%s: percentage %q %v, want %s", id, got, err, want)
		}
	}

	// GPU-b no longer shared: its daemon quits, GPU-a's keeps running.
	before, _ := os.Stat(PathsOf(root, "GPU-a").Control())
	m.Sync(prog, []Daemon{{ID: "GPU-a", Visible: "GPU-a", ActiveThreadPercentage: 25}})
	eventually(t, "GPU-b's daemon gone", func() bool {
		_, err := os.Stat(PathsOf(root, "GPU-b").Control())
		return os.IsNotExist(err)
	})
	after, err := os.Stat(PathsOf(root, "GPU-a").Control())
	if err != nil || !os.SameFile(before, after) {
		t.Errorf("GPU-a's daemon was restarted by a Sync that kept it: %v", err)
	}
	if err := m.Ready(); err != nil {
		t.Error(err)
	}
	stop()
	if _, err := os.Stat(PathsOf(root, "GPU-a").Control()); !os.IsNotExist(err) {
		t.Errorf("daemon still listening after Run returned: %v", err)
	}
}

func TestDaemonThatExitsIsReportedAndRestarted(t *testing.T) {
	crash := filepath.Join(t.TempDir(), "crash")
	if err := os.WriteFile(crash, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m, prog, _ := newManager(t, "MPS_TEST_CRASH="+crash)
	stop := run(t, m)
	defer stop()
	m.Sync(prog, []Daemon{{ID: "GPU-a", Visible: "GPU-a", ActiveThreadPercentage: 50}})
	eventually(t, "the exit reported", func() bool {
		err := m.Ready()
		return err != nil && strings.Contains(err.Error(), "GPU-a: exited (exit status 3)")
	})
	if err := os.Remove(crash); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the restarted daemon ready", func() bool { return m.Ready() == nil })
}

func TestStaleSocketOfAKilledDaemonIsCleared(t *testing.T) {
	m, prog, root := newManager(t)
	p := PathsOf(root, "GPU-a")
	if err := os.MkdirAll(p.Pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unixpacket", p.Control())
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	stop := run(t, m)
	defer stop()
	m.Sync(prog, []Daemon{{ID: "GPU-a", Visible: "GPU-a", ActiveThreadPercentage: 50}})
	eventually(t, "daemon ready beside the stale socket", func() bool { return m.Ready() == nil })
}

func TestMissingBinaryNamesThePackage(t *testing.T) {
	m := New(t.TempDir(), WithRestartBackoff(time.Hour))
	stop := run(t, m)
	defer stop()
	m.Sync(Program{Path: "/nonexistent/nvidia-cuda-mps-control"}, []Daemon{{ID: "GPU-a", Visible: "GPU-a", ActiveThreadPercentage: 50}})
	eventually(t, "the error", func() bool {
		err := m.Ready()
		return err != nil && strings.Contains(err.Error(), "Debian: nvidia-cuda-mps")
	})
}

// A daemon's ID names its directories under root: one that is not a
// single file name (a claim UID from a crafted checkpoint, say) is never
// started, so nothing is made or removed outside root.
func TestDaemonIDMustBeOneFileName(t *testing.T) {
	m, prog, root := newManager(t)
	escape := "../" + filepath.Base(root) + "-outside"
	outside := filepath.Join(root, escape)
	stop := run(t, m)
	defer stop()
	m.Sync(prog, []Daemon{{ID: escape, Visible: "GPU-a"}, {ID: "..", Visible: "GPU-a"}, {ID: "GPU-a", Visible: "GPU-a"}})
	eventually(t, "the valid daemon ready", func() bool { return m.Ready() == nil })
	if _, err := os.Stat(outside); !os.IsNotExist(err) {
		t.Errorf("a daemon ID reached %s: %v", outside, err)
	}
	ents, _ := os.ReadDir(root)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"GPU-a", "shm"}) {
		t.Errorf("under root: %q, want GPU-a and shm alone", names)
	}
}

// Wait returns once the daemon's limits are set: they read back at once;
// a daemon not wanted is an error, and so is one not ready in time.
func TestWaitUntilLimitsSet(t *testing.T) {
	m, prog, root := newManager(t)
	defer run(t, m)()
	m.Sync(prog, []Daemon{{ID: "share-a", Visible: "GPU-a", ActiveThreadPercentage: 30}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.Wait(ctx, "share-a"); err != nil {
		t.Fatal(err)
	}
	if got, err := prog.Command(context.Background(), PathsOf(root, "share-a").Pipe, "get_default_active_thread_percentage"); err != nil || got != "30.0" {
		t.Errorf("percentage right after Wait: %q %v, want 30.0", got, err)
	}
	if err := m.Wait(ctx, "other"); err == nil || !strings.Contains(err.Error(), "not wanted") {
		t.Errorf("Wait for a daemon not wanted: %v", err)
	}
	m.Sync(Program{Path: "/nonexistent/nvidia-cuda-mps-control"}, []Daemon{{ID: "share-b", Visible: "GPU-b", ActiveThreadPercentage: 30}})
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := m.Wait(short, "share-b"); err == nil || !strings.Contains(err.Error(), "share-b not ready") {
		t.Errorf("Wait for a daemon that cannot start: %v", err)
	}
}
