package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const uuid = "GPU-f600f526-b58e-5106-a700-ac0942c77830"

// spec is a CDI spec in the shape both generators write: one device with its
// node, common mounts and a hook.
func spec(kind string, mounts []string, hook string) string {
	var b strings.Builder
	b.WriteString("cdiVersion: 0.6.0\nkind: " + kind + "\ndevices:\n  - name: " + uuid + "\n    containerEdits:\n      deviceNodes:\n        - {path: /dev/nvidia0, type: c, major: 195, minor: 0}\ncontainerEdits:\n  env: [NVIDIA_VISIBLE_DEVICES=void]\n  deviceNodes:\n    - {path: /dev/nvidiactl, type: c, major: 195, minor: 255}\n  mounts:\n")
	for _, m := range mounts {
		b.WriteString("    - {hostPath: /drv" + m + ", containerPath: " + m + ", options: [ro, nosuid, nodev, rbind]}\n")
	}
	if hook != "" {
		b.WriteString("  hooks:\n    - {hookName: createContainer, path: /bin/" + hook + ", args: [" + hook + ", update-ldcache, --folder, /usr/lib]}\n")
	}
	return b.String()
}

func write(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCompareListsWhatOnlyOneInjects(t *testing.T) {
	dir := t.TempDir()
	ours := write(t, dir, "ours.yaml", spec("nvidia.com/gpu", []string{"/usr/bin/nvidia-smi", "/usr/lib/libcuda.so.535"}, "nvinject-cdi-hook"))
	theirs := write(t, dir, "theirs.yaml", spec("nvidia.com/gpu", []string{"/usr/bin/nvidia-smi", "/usr/lib/libnvcuvid.so.535"}, "nvidia-cdi-hook"))
	var out bytes.Buffer
	if err := run(context.Background(), []string{"compare", "--ours", ours, "--theirs", theirs, "--device", uuid}, &out, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"only in " + theirs + ": mount /usr/lib/libnvcuvid.so.535\n",
		"only in " + ours + ": mount /usr/lib/libcuda.so.535\n",
		"summary: 1 only in theirs, 1 only in ours\n",
		// Hooks compare by subcommand, whichever program runs them; device
		// nodes, env and the shared mount are in both.
		"in both: 5\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("compare output lacks %q:\n%s", want, got)
		}
	}
	if err := run(context.Background(), []string{"compare", "--ours", ours, "--theirs", theirs, "--device", "GPU-other"}, &out, &out); err == nil || !strings.Contains(err.Error(), `no device "GPU-other"`) {
		t.Errorf("compare for a missing device: %v, want an error naming it", err)
	}
}

func TestOCIInjectsTheCDIDevice(t *testing.T) {
	dir := t.TempDir()
	specDir := filepath.Join(dir, "cdi")
	bundle := filepath.Join(dir, "bundle")
	for _, d := range []string{specDir, bundle} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, specDir, "nvinject.yaml", spec("nvidia.com/gpu", []string{"/usr/bin/nvidia-smi"}, "nvinject-cdi-hook"))
	var out bytes.Buffer
	args := []string{"oci", "--cdi-spec-dir", specDir, "--device", "nvidia.com/gpu=" + uuid, "--bundle", bundle, "--", "nvidia-smi", "-L"}
	if err := run(context.Background(), args, &out, &out); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s oci.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, d := range s.Linux.Devices {
		nodes = append(nodes, d.Path)
	}
	if strings.Join(nodes, " ") != "/dev/nvidiactl /dev/nvidia0" && strings.Join(nodes, " ") != "/dev/nvidia0 /dev/nvidiactl" {
		t.Errorf("device nodes %v, want /dev/nvidia0 and /dev/nvidiactl", nodes)
	}
	allowed := 0
	for _, r := range s.Linux.Resources.Devices {
		if r.Allow && r.Major != nil && *r.Major == 195 {
			allowed++
		}
	}
	if allowed != 2 || s.Linux.Resources.Devices[0].Allow {
		t.Errorf("device cgroup rules %+v, want deny-all then an allow for each of the 2 nodes", s.Linux.Resources.Devices)
	}
	if len(s.Hooks.CreateContainer) != 1 || s.Hooks.CreateContainer[0].Path != "/bin/nvinject-cdi-hook" {
		t.Errorf("createContainer hooks %+v, want the spec's one", s.Hooks.CreateContainer)
	}
	if !strings.Contains(strings.Join(s.Process.Env, " "), "NVIDIA_VISIBLE_DEVICES=void") || strings.Join(s.Process.Args, " ") != "nvidia-smi -L" {
		t.Errorf("process %+v", s.Process)
	}
	if err := run(context.Background(), []string{"oci", "--cdi-spec-dir", specDir, "--device", "nvidia.com/gpu=GPU-none", "--bundle", bundle, "--", "true"}, &out, &out); err == nil {
		t.Error("oci for an unknown device succeeded")
	}
}

// plugin is a device plugin reporting one device with health.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	health string
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: uuid, Health: p.health}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range r.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=" + c.DevicesIds[0]}}})
	}
	return resp, nil
}

// startPlugin serves p in dir and registers it with the kubelet there.
func startPlugin(t *testing.T, ctx context.Context, dir string, p *plugin) {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "p.sock"))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	// Register as a device plugin does: retry until the kubelet answers
	// (its socket file exists a moment before it accepts).
	wg.Go(func() {
		sock := "unix://" + filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
		for ctx.Err() == nil {
			conn, err := grpc.NewClient(sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Error(err)
				return
			}
			_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
				Version: pluginapi.Version, Endpoint: "p.sock", ResourceName: "nvidia.com/gpu"})
			conn.Close()
			if err == nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
}

func TestKubeletWatchesTheRegisteredPlugin(t *testing.T) {
	for _, tt := range []struct {
		health, want, wantErr string
	}{
		{health: pluginapi.Healthy, want: "Allocate " + uuid + ": CDI nvidia.com/gpu=" + uuid},
		{health: pluginapi.Unhealthy, want: "1 devices: " + uuid + " Unhealthy", wantErr: "never reported a Healthy device"},
	} {
		t.Run(tt.health, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "gpuck")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			startPlugin(t, ctx, dir, &plugin{health: tt.health})
			var out bytes.Buffer
			err = watchPlugin(ctx, dir, "nvidia.com/gpu", &out)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("watchPlugin: %v, want %q", err, tt.wantErr)
			}
			if !strings.Contains(out.String(), "Register: resource nvidia.com/gpu, endpoint p.sock") || !strings.Contains(out.String(), tt.want) {
				t.Errorf("kubelet output lacks the registration or %q:\n%s", tt.want, out.String())
			}
		})
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"nope"}, {"kubelet"}, {"oci", "--cdi-spec-dir", "x"}, {"compare", "--ours", "a"}} {
		var out bytes.Buffer
		if err := run(context.Background(), args, &out, &out); err == nil {
			t.Errorf("%q: no usage error", args)
		}
	}
}
