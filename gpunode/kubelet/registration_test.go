package kubelet

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
)

// quiet is how long a test waits to see that no further Register comes:
// many polls and more than the stream settle time.
const quiet = 300 * time.Millisecond

// startRegistrar runs a registrar over the fake kubelet's directory with a
// fast poll and settle, hook (if any) between opening and dialing
// kubelet.sock, and stops it when the test ends.
func startRegistrar(t *testing.T, dir string, hook func(), opts ...Option) *Registrar {
	t.Helper()
	return runRegistrar(t, dir, append([]Option{WithPoll(5 * time.Millisecond), func(r *Registrar) {
		r.settle = 50 * time.Millisecond
		if hook != nil {
			r.dialHook = hook
		}
	}}, opts...)...)
}

// settled waits out the quiet period and fails unless kubelet k accepted
// exactly the endpoints want and refused none, and is connected to the last.
func settled(t *testing.T, k *kubelettest.Kubelet, want ...string) {
	t.Helper()
	k.WaitConnected(t, want[len(want)-1], 2*time.Second)
	time.Sleep(quiet)
	if got := k.Accepted(); !slices.Equal(got, want) {
		t.Errorf("kubelet accepted Registers %v, want %v", got, want)
	}
	if got := k.Rejected(); len(got) > 0 {
		t.Errorf("kubelet refused Registers as already connected: %v", got)
	}
	if !k.Connected(want[len(want)-1]) {
		t.Errorf("kubelet lost the plugin after the quiet period (accepted %v)", k.Accepted())
	}
}

// Each ordering of a kubelet restart's steps against the plugin ends with
// exactly one accepted Register for the new kubelet and none refused,
// whether the plugin sees the directory through inotify or by listing it.
func TestOneRegisterPerKubeletInstance(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart func(t *testing.T, old *kubelettest.Kubelet) *kubelettest.Kubelet
	}{
		{"cleanup then listen, as kubelet starts", func(t *testing.T, old *kubelettest.Kubelet) *kubelettest.Kubelet {
			old.Stop()
			return kubelettest.Start(t, old.Dir)
		}},
		{"stale kubelet.sock kept a while after the cleanup of the plugin socket", func(t *testing.T, old *kubelettest.Kubelet) *kubelettest.Kubelet {
			old.Stop()
			if err := os.Remove(filepath.Join(old.Dir, "p.sock")); err != nil {
				t.Fatal(err)
			}
			waitFile(t, filepath.Join(old.Dir, "p.sock"))
			return kubelettest.Start(t, old.Dir)
		}},
		{"new kubelet.sock before the plugin socket is cleaned up", func(t *testing.T, old *kubelettest.Kubelet) *kubelettest.Kubelet {
			old.Stop()
			k := kubelettest.Listen(t, old.Dir)
			k.WaitConnected(t, "p.sock", 2*time.Second)
			if err := os.Remove(filepath.Join(old.Dir, "p.sock")); err != nil {
				t.Fatal(err)
			}
			waitFile(t, filepath.Join(old.Dir, "p.sock"))
			return k
		}},
		{"kubelet.sock absent for a while", func(t *testing.T, old *kubelettest.Kubelet) *kubelettest.Kubelet {
			old.Stop()
			kubelettest.Cleanup(t, old.Dir)
			// Long enough for the plugin to look several times.
			time.Sleep(20 * time.Millisecond)
			return kubelettest.Listen(t, old.Dir)
		}},
	} {
		for _, m := range watchModes {
			t.Run(tc.name+"/"+m.name, func(t *testing.T) {
				dir := kubelettest.Dir(t)
				k := kubelettest.Start(t, dir)
				startRegistrar(t, dir, nil, m.opts...)
				settled(t, k, "p.sock")
				for range 3 {
					k = tc.restart(t, k)
					settled(t, k, "p.sock")
				}
			})
		}
	}
}

// The race the fresh-clone CI hit: the plugin looks at kubelet.sock while
// the stopped kubelet's file is still there, and the new kubelet replaces
// it before the dial. The Register must count for the file it reached.
func TestStaleKubeletSocketReplacedBeforeTheDial(t *testing.T) {
	dir := kubelettest.Dir(t)
	kubelettest.Start(t, dir).Stop() // leaves a stale kubelet.sock
	var (
		once sync.Once
		k    *kubelettest.Kubelet
		up   = make(chan struct{})
	)
	startRegistrar(t, dir, func() {
		once.Do(func() {
			k = kubelettest.Listen(t, dir)
			close(up)
		})
	})
	select {
	case <-up:
	case <-time.After(2 * time.Second):
		t.Fatal("the plugin never tried to register")
	}
	settled(t, k, "p.sock")
}

// A kubelet whose device manager already refuses the plugin's path (a
// rejected duplicate left its entry) gets the plugin on a fresh socket
// name, without a kubelet restart.
func TestRefusedPathRecoversOnAFreshSocket(t *testing.T) {
	dir := kubelettest.Dir(t)
	k := kubelettest.Start(t, dir)
	k.Wedge("p.sock")
	r := startRegistrar(t, dir, nil)
	k.WaitConnected(t, "p-1.sock", 2*time.Second)
	time.Sleep(quiet)
	if got := k.Rejected(); !slices.Equal(got, []string{"p.sock"}) {
		t.Errorf("refused %v, want only the wedged p.sock", got)
	}
	if got := k.Accepted(); !slices.Equal(got, []string{"p-1.sock"}) {
		t.Errorf("accepted %v, want p-1.sock once", got)
	}
	if r.Endpoint() != filepath.Join(dir, "p-1.sock") || !r.Registered() {
		t.Errorf("endpoint %s, registered %v", r.Endpoint(), r.Registered())
	}
	if _, err := os.Stat(filepath.Join(dir, "p.sock")); !os.IsNotExist(err) {
		t.Errorf("refused socket left in kubelet's directory: %v", err)
	}
	// The next kubelet has no refused path, and gets one Register.
	k = k.Restart(t)
	settled(t, k, "p-1.sock")
}

// kubelet drops the plugin's stream without restarting (its client ended):
// the plugin registers again, once.
func TestStreamDroppedByKubeletRegistersAgain(t *testing.T) {
	dir := kubelettest.Dir(t)
	k := kubelettest.Start(t, dir)
	startRegistrar(t, dir, nil)
	settled(t, k, "p.sock")
	k.Drop("p.sock")
	settled(t, k, "p.sock", "p.sock")
}

func waitFile(t *testing.T, p string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, err := os.Stat(p); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not served again within 2s", p)
		}
		time.Sleep(time.Millisecond)
	}
}

// A client other than kubelet (a debugging tool) opening and closing a
// ListAndWatch stream is not kubelet: no Register follows either, and a
// restarted kubelet still gets one while that client's stream is open.
func TestOtherClientsStreamsAreNotKubelets(t *testing.T) {
	dir := kubelettest.Dir(t)
	k := kubelettest.Start(t, dir)
	startRegistrar(t, dir, nil)
	settled(t, k, "p.sock")
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := kubelettest.Dial(t, dir, "p.sock").ListAndWatch(ctx, &pluginapi.Empty{}); err != nil {
		t.Fatal(err)
	}
	k.Drop("p.sock")
	settled(t, k, "p.sock", "p.sock")
	cancel()
	settled(t, k, "p.sock", "p.sock")
}
