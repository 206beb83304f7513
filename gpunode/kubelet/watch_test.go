package kubelet

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
)

// runRegistrar starts a registrar in dir and stops it when the test ends.
func runRegistrar(t testing.TB, dir string, opts ...Option) *Registrar {
	t.Helper()
	stop := make(chan struct{})
	opts = append([]Option{WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))), WithBackoff(time.Millisecond, 4*time.Millisecond),
		WithStopService(func() { close(stop) })}, opts...)
	r := New(dir, "p.sock", "nvidia.com/gpu", svc{stop: stop}, opts...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return r
}

// watchModes are the two ways the registrar sees its directory change.
var watchModes = []struct {
	name string
	opts []Option
}{
	{"inotify", nil},
	{"poll only", []Option{WithoutWatch()}},
}

// With a poll far longer than the test, only the directory watch (inotify,
// or the listing where inotify is left out) can notice the restarted
// kubelet and the removed plugin socket.
func TestWatchReRegistersWithoutThePoll(t *testing.T) {
	for _, m := range watchModes {
		t.Run(m.name, func(t *testing.T) {
			dir := kubelettest.Dir(t)
			k := kubelettest.Start(t, dir)
			runRegistrar(t, dir, append([]Option{WithPoll(time.Hour)}, m.opts...)...)
			k.WaitRegister(t, 2*time.Second)
			for _, removeOwn := range []bool{false, true} {
				if removeOwn {
					if err := os.Remove(filepath.Join(dir, "p.sock")); err != nil {
						t.Fatal(err)
					}
				}
				k = k.Restart(t)
				req := k.WaitRegister(t, 2*time.Second)
				if req.Endpoint != "p.sock" {
					t.Fatalf("Register request %v", req)
				}
				if _, err := os.Stat(filepath.Join(dir, "p.sock")); err != nil {
					t.Fatalf("plugin socket not served again (own socket removed: %v): %v", removeOwn, err)
				}
			}
		})
	}
}

// A plugin socket removed while kubelet keeps running (no restart to see)
// is served again through the watch, not the hour-long poll.
func TestRemovedPluginSocketServedAgainWithoutThePoll(t *testing.T) {
	for _, m := range watchModes {
		t.Run(m.name, func(t *testing.T) {
			dir := kubelettest.Dir(t)
			k := kubelettest.Start(t, dir)
			runRegistrar(t, dir, append([]Option{WithPoll(time.Hour)}, m.opts...)...)
			k.WaitConnected(t, "p.sock", 2*time.Second)
			// The stream's wake-up of the registrar has passed.
			time.Sleep(quiet)
			if err := os.Remove(filepath.Join(dir, "p.sock")); err != nil {
				t.Fatal(err)
			}
			waitFile(t, filepath.Join(dir, "p.sock"))
		})
	}
}

// Where the directory cannot be watched, the poll still re-registers.
func TestPollAloneReRegisters(t *testing.T) {
	dir := kubelettest.Dir(t)
	k := kubelettest.Start(t, dir)
	runRegistrar(t, dir, WithoutWatch(), WithPoll(5*time.Millisecond))
	k.WaitRegister(t, 2*time.Second)
	k = k.Restart(t)
	k.WaitRegister(t, 2*time.Second)
}

// The kubelet directory does not exist yet when the plugin starts: it
// lists it until it does, then watches it (or keeps listing it).
func TestWatchStartsOnceTheDirectoryExists(t *testing.T) {
	for _, m := range watchModes {
		t.Run(m.name, func(t *testing.T) {
			dir := filepath.Join(kubelettest.Dir(t), "device-plugins")
			runRegistrar(t, dir, append([]Option{WithPoll(time.Hour)}, m.opts...)...)
			time.Sleep(3 * fallbackPoll)
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			k := kubelettest.Start(t, dir)
			k.WaitRegister(t, 2*time.Second)
			k = k.Restart(t)
			k.WaitRegister(t, 2*time.Second)
		})
	}
}
