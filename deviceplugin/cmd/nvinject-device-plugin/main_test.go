package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nvinject/nvinject/cdi/simulation/simtest"
	"github.com/nvinject/nvinject/gpunode/kubelet/kubelettest"
	"github.com/nvinject/nvinject/gpunode/nodemove/nodemovetest"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nvdp-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "nvinject-device-plugin")
	build := exec.Command("go", "build", "-ldflags=-s -w", "-o", binary, ".") // as make build and the images, so the idle RSS logged is theirs
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		panic("build the plugin: " + err.Error())
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type proc struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan error
}

// launch runs the plugin binary; it has no API server, so no node labels.
func launch(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary, args...), stderr: &bytes.Buffer{}, done: make(chan error, 1)}
	p.cmd.Env = append(append(os.Environ(), "NVINJECT_STATE_DIR="+t.TempDir(), "NVINJECT_NODE_LABELS=false"), env...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("process did not exit in %s; stderr:\n%s", timeout, p.stderr)
		return -1
	}
}

func post(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Post(url, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s %s", url, resp.Status, body)
	}
	return string(body)
}

// TestBinaryOnSimulatedEightGPUNode runs the real binary the way the
// the example DaemonSet does (env from the ConfigMap) and stops it with SIGTERM.
func TestBinaryOnSimulatedEightGPUNode(t *testing.T) {
	const nvml = "sim:a100-80gb*8"
	dir := kubelettest.Dir(t)
	simtest.DriverRoot(t, nvml, filepath.Join(dir, "sim"))
	root := filepath.Join(dir, "sim", "driver-root")
	k := kubelettest.Start(t, dir)
	pr := nodemovetest.Start(t, filepath.Join(dir, "pr.sock"))
	selected := sim.UUID("a100-80gb", 6)
	addr := freeAddr(t)
	p := launch(t, []string{"NVIDIA_VISIBLE_DEVICES=" + selected, "MIG_STRATEGY=none", "DEVICE_LIST_STRATEGY=cdi-annotations,cdi-cri", "DEVICE_ID_STRATEGY=uuid", "NVINJECT_POD_RESOURCES_SOCKET=" + pr.Socket},
		"--nvml="+nvml, "--kubelet-dir="+dir, "--cdi-spec-dir="+filepath.Join(dir, "cdi"), "--driver-root="+root, "--metrics-addr="+addr)
	req := k.WaitRegister(t, 20*time.Second)
	client := kubelettest.Dial(t, dir, req.Endpoint)
	stream, err := client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Devices) != 1 || resp.Devices[0].ID != selected {
			t.Fatalf("published %v; want only %s", resp.Devices, selected)
		}
		if resp.Devices[0].Health == pluginapi.Healthy {
			break
		}
	}
	if rss := vmRSS(t, p.cmd.Process.Pid); rss != "" {
		t.Logf("idle VmRSS on the simulated 8-GPU node: %s", rss)
	}
	post(t, "http://"+addr+"/debug/sim/xid?uuid="+selected+"&xid=79")
	if resp, err := stream.Recv(); err != nil || resp.Devices[0].Health != pluginapi.Unhealthy {
		t.Fatalf("after injected Xid 79: %v, %v", resp, err)
	}
	post(t, "http://"+addr+"/debug/sim/recover?uuid="+selected)
	if resp, err := stream.Recv(); err != nil || resp.Devices[0].Health != pluginapi.Healthy {
		t.Fatalf("after recover: %v, %v", resp, err)
	}
	// The operator's way back in real mode: SIGHUP clears the marks.
	post(t, "http://"+addr+"/debug/sim/xid?uuid="+selected+"&xid=48")
	if resp, err := stream.Recv(); err != nil || resp.Devices[0].Health != pluginapi.Unhealthy {
		t.Fatalf("after injected Xid 48: %v, %v", resp, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if resp, err := stream.Recv(); err != nil || resp.Devices[0].Health != pluginapi.Healthy {
		t.Fatalf("after SIGHUP: %v, %v", resp, err)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; stderr:\n%s", code, p.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, req.Endpoint)); !os.IsNotExist(err) {
		t.Fatalf("plugin socket left behind: %v", err)
	}
	if _, err := stream.Recv(); err == nil {
		t.Fatal("ListAndWatch stream still open after SIGTERM")
	}
	if !strings.Contains(p.stderr.String(), "effective configuration") {
		t.Fatalf("effective configuration not logged:\n%s", p.stderr)
	}
}

func vmRSS(t *testing.T, pid int) string {
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:"))
		}
	}
	return ""
}

func TestBinaryWithoutNVML(t *testing.T) {
	dir := kubelettest.Dir(t)
	common := []string{"--nvml=real", "--kubelet-dir=" + dir, "--cdi-spec-dir=" + filepath.Join(dir, "cdi"), "--driver-root=" + dir}

	t.Run("exit", func(t *testing.T) {
		p := launch(t, nil, append(common, "--metrics-addr=", "--on-nvml-error=exit")...)
		if code := p.wait(t, 10*time.Second); code != 1 {
			t.Fatalf("exit code %d; want 1", code)
		}
		if !strings.Contains(p.stderr.String(), "libnvidia-ml.so.1 not found") {
			t.Fatalf("stderr does not say NVML is missing:\n%s", p.stderr)
		}
	})
	t.Run("wait", func(t *testing.T) {
		addr := freeAddr(t)
		p := launch(t, nil, append(common, "--metrics-addr="+addr, "--on-nvml-error=wait")...)
		var body string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			resp, err := http.Get("http://" + addr + "/readyz")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				body = string(b)
				if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(body, "NVML") {
					break
				}
			}
			time.Sleep(20 * time.Millisecond) // the HTTP server offers no start signal to another process
		}
		if !strings.Contains(body, "libnvidia-ml.so.1 not found") {
			t.Fatalf("/readyz = %q; want it to say NVML is missing", body)
		}
		if _, err := os.Stat(filepath.Join(dir, "nvinject-gpu.sock")); !os.IsNotExist(err) {
			t.Fatal("plugin socket served without GPUs")
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		if code := p.wait(t, 10*time.Second); code != 0 {
			t.Fatalf("exit code %d after SIGTERM while waiting for NVML", code)
		}
	})
}
