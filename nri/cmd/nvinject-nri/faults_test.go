package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	validator "github.com/containerd/nri/plugins/default-validator/builtin"

	"github.com/nvinject/nvinject/nri/internal/nritest"
	"github.com/nvinject/nvinject/shared/contract"
)

// TestHungAndKilledFailClosed runs the built binary against NRI v0.11.0's
// runtime side with containerd's default validator and default
// plugin_request_timeout, stops it with SIGSTOP (a hung plugin), resumes
// it, then SIGKILLs and restarts it. No GPU container gets through while
// it is not answering; each figure is logged.
func TestHungAndKilledFailClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	const timeout = 2 * time.Second // containerd's default plugin_request_timeout
	bin := filepath.Join(t.TempDir(), "nvinject-nri")
	build := exec.Command("go", "build", "-tags", "nri_no_wasm", "-o", bin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	node := nritest.NewNode(t, "sim:a100-80gb*2", false)
	sockDir, err := os.MkdirTemp("", "nvnri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	nritest.RequestTimeout(t, timeout)
	rt := nritest.NewRuntime(filepath.Join(sockDir, "nri.sock"), nil, nil,
		adaptation.WithDefaultValidator(&validator.DefaultValidatorConfig{Enable: true}))
	rt.Start(t)
	// Both launches' stderr copiers write here.
	logs := &lockedBuilder{}
	launch := func() *exec.Cmd {
		cmd := exec.Command(bin, "--socket-path", rt.Socket, "--cdi-spec-dir", node.SpecDir, "--nvml", "sim:a100-80gb*2",
			"--metrics-addr", "", "--log-format", "text")
		cmd.Stderr = logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
		return cmd
	}
	cmd := launch()
	rt.WaitSynced(t)

	n := 0
	create := func(gpu bool) (time.Duration, error) {
		n++
		id := fmt.Sprintf("p%d", n)
		pod, ann := nritest.Pod(id, "", nil), map[string]string(nil)
		if gpu {
			pod = nritest.Pod(id, contract.RuntimeHandler, map[string]string{contract.RequiredPluginsAnnotation: `["` + contract.NRIPluginName + `"]`})
			ann = map[string]string{contract.DevicesAnnotation: node.Name(1)}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		t0 := time.Now()
		_, err := rt.Create(ctx, pod, nritest.Container("c"+id, id, "main", nritest.BaseSpec(), ann))
		return time.Since(t0), err
	}
	// untilGPU polls until a GPU container passes again.
	untilGPU := func(what string) time.Duration {
		t0 := time.Now()
		for {
			_, err := create(true)
			if err == nil {
				return time.Since(t0)
			}
			if !strings.Contains(err.Error(), "not present") && !strings.Contains(err.Error(), "validator plugin") {
				t.Fatalf("%s: GPU pod refused for an unexpected reason: %v", what, err)
			}
			if time.Since(t0) > 20*time.Second {
				t.Fatalf("%s: GPU pods still refused after 20s: %v\n%s", what, err, logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := create(true); err != nil {
		t.Fatalf("healthy: %v", err)
	}

	// Hung: the first call after the stop waits out the runtime's timeout
	// and fails, whatever the pod; then the plugin is gone and only pods
	// requiring it are refused.
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, cmd.Process.Pid)
	took, err := create(false)
	if err == nil || !strings.Contains(err.Error(), "validator plugin 10-nvinject failed") {
		t.Fatalf("hung, first call (non-GPU pod): err = %v, want the timed-out validator failing it", err)
	}
	t.Logf("hung: first call (non-GPU pod) refused after %s: %v", took.Round(time.Millisecond), err)
	if _, err := create(true); err == nil || !strings.Contains(err.Error(), `required plugin "nvinject" not present`) {
		t.Fatalf("hung, GPU pod: err = %v, want the default validator's refusal", err)
	}
	if took, err := create(false); err != nil {
		t.Fatalf("hung, later non-GPU pod: %v", err)
	} else {
		t.Logf("hung: later non-GPU pod created in %s", took.Round(time.Millisecond))
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("hung: GPU pods pass again %s after SIGCONT", untilGPU("after SIGCONT").Round(time.Millisecond))

	// Killed and restarted.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_, _ = cmd.Process.Wait()
	for range 2 { // the first call may still list the closed plugin
		if _, err = create(true); err != nil && strings.Contains(err.Error(), "not present") {
			break
		}
	}
	if err == nil || !strings.Contains(err.Error(), "not present") {
		t.Fatalf("killed, GPU pod: err = %v, want the default validator's refusal", err)
	}
	launch()
	t.Logf("killed: GPU pods pass again %s after the restart (process start, inventory, registration)", untilGPU("after restart").Round(time.Millisecond))
}

type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitStopped waits until every thread of pid has stopped: SIGSTOP takes
// effect as each thread handles it, and on a busy machine the plugin
// answered a request after the signal was sent (no "closing plugin" in
// the runtime's log, the container created).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		stopped := 0
		for _, task := range tasks {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
			// The state follows the parenthesised command name.
			if _, rest, ok := strings.Cut(string(stat), ") "); err == nil && ok && strings.HasPrefix(rest, "T") {
				stopped++
			}
		}
		if stopped == len(tasks) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nvinject-nri (pid %d): %d of %d threads stopped 5s after SIGSTOP", pid, stopped, len(tasks))
		}
		time.Sleep(time.Millisecond)
	}
}
