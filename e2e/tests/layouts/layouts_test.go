package layouts_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/e2e/harness/driverroot"
	"github.com/nvinject/nvinject/e2e/harness/nvctk"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// script is what the container runs: the real nvidia-smi, the loader's view of
// libcuda, and CUDA's own initialisation through gpu-probe.
const script = `echo "-- smi"; nvidia-smi; echo "exit $?"
echo "-- ldconfig"; ldconfig -p | grep -E 'libcuda\.so\.1 '
echo "-- probe"; gpu-probe; echo "-- end"`

// verdict is what one container showed. Without hooks nothing updates the image's
// ld.so.cache, so ldconfig -p is not asked of it (noCache).
type verdict struct{ smi, ldconfig, cuda, noCache bool }

func (v verdict) ok() bool { return v.smi && (v.ldconfig || v.noCache) && v.cuda }

func (v verdict) String() string {
	if v.ok() {
		if v.noCache && !v.ldconfig {
			return "ok (ld.so.cache not updated)"
		}
		return "ok"
	}
	var failed []string
	for _, f := range []struct {
		ok   bool
		name string
	}{{v.smi, "nvidia-smi"}, {v.ldconfig || v.noCache, "ldconfig -p"}, {v.cuda, "cuInit"}} {
		if !f.ok {
			failed = append(failed, f.name)
		}
	}
	return strings.Join(failed, ", ") + " failed"
}

func judge(out string) verdict {
	return verdict{
		smi:      strings.Contains(out, "couldn't communicate with the NVIDIA driver"),
		ldconfig: strings.Contains(out, "libcuda.so.1 (libc6,x86-64)"),
		cuda:     strings.Contains(out, "cuInit(0) = 100"),
	}
}

// TestLayouts: on every layout nvinject's container (with the hooks, as the DaemonSets
// run it) gets a working nvidia-smi, an ld.so.cache listing libcuda and a libcuda whose
// cuInit answers; the table it logs puts nvinject's spec without hooks and nvidia-ctk's
// beside it.
func TestLayouts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runc and mknod need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	runc := filepath.Join(os.Getenv("NVINJECT_TOOLS_BIN"), "runc")
	if os.Getenv("NVINJECT_TOOLS_BIN") == "" {
		out, err := exec.Command("../../harness/tools/build.sh", "--print-bin").Output()
		if err != nil {
			t.Skipf("no runc: run make tools (%v)", err)
		}
		runc = filepath.Join(strings.TrimSpace(string(out)), "runc")
	}
	if _, err := os.Stat(runc); err != nil {
		t.Skipf("no runc: run make tools (%v)", err)
	}
	ctkBin, err := nvctk.Bin(ctx)
	if err != nil {
		t.Skipf("no nvidia-ctk: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	for _, b := range []struct{ pkg, cgo string }{{"../../cmd/gpu-probe", "1"}, {"../../../cdi/cmd/nvinject-cdi-hook", "0"}} {
		build := exec.Command("go", "build", "-o", bin+"/", b.pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	image := filepath.Join(dir, "image")
	writeImage(t, image, filepath.Join(bin, "gpu-probe"))
	devRoot := filepath.Join(dir, "devroot")
	if err := nvctk.MakeDevRoot(devRoot); err != nil {
		t.Fatal(err)
	}

	var rows []string
	n := 0
	for _, layout := range driverroot.HostLayouts() {
		root, err := driverroot.RootOf(ctx, driverroot.DriverVersion, layout)
		if err != nil {
			t.Skipf("driver root %s: %v", layout, err)
		}
		be, err := backend.Open("sim:a100-80gb", backend.Options{DriverRoot: root})
		if err != nil {
			t.Fatal(err)
		}
		node, err := be.Discover(ctx)
		be.Close()
		if err != nil {
			t.Fatal(err)
		}
		cells := []string{layout}
		for _, mode := range []string{"hooks", "no hooks", "nvidia-ctk"} {
			n++
			specDir := filepath.Join(dir, fmt.Sprintf("cdi-%d", n))
			if err := os.MkdirAll(specDir, 0o755); err != nil {
				t.Fatal(err)
			}
			var device string
			switch mode {
			case "nvidia-ctk":
				y, err := nvctk.GenerateManagement(ctx, root, devRoot, "--nvidia-cdi-hook-path="+filepath.Join(ctkBin, "nvidia-cdi-hook"))
				if err != nil {
					t.Fatalf("%s: %v", layout, err)
				}
				if err := os.WriteFile(filepath.Join(specDir, "nvidia.yaml"), y, 0o644); err != nil {
					t.Fatal(err)
				}
				device = "nvidia.com/gpu=all"
			default:
				hook := ""
				if mode == "hooks" {
					hook = filepath.Join(bin, "nvinject-cdi-hook")
				}
				g := spec.New(spec.WithDriverRoot(root), spec.WithHookBinary(hook))
				s, err := g.Generate(node, node.Devices[:1])
				if err != nil {
					t.Fatalf("%s, %s: %v", layout, mode, err)
				}
				if _, _, err := spec.Write(specDir, s); err != nil {
					t.Fatal(err)
				}
				device = g.QualifiedName(node.Devices[0].UUID)
			}
			out, mounts := run(ctx, t, runc, image, filepath.Join(dir, fmt.Sprintf("run-%d", n)), specDir, device)
			v := judge(out)
			v.noCache = mode == "no hooks"
			t.Logf("%s, %s: %s\n%s", layout, mode, v, out)
			if mode == "hooks" && !v.ok() {
				t.Errorf("%s: nvinject's container (with hooks): %s; its output:\n%s", layout, v, out)
			}
			cells = append(cells, describe(mounts), v.String())
		}
		rows = append(rows, "| "+strings.Join(cells, " | ")+" |")
	}
	t.Logf("layout | nvinject (hooks) mounts | verdict | nvinject (no hooks) mounts | verdict | nvidia-ctk mounts | verdict\n%s", strings.Join(rows, "\n"))
}

// describe says where a spec puts nvidia-smi, libcuda and the firmware.
func describe(mounts []oci.Mount) string {
	var smi, cuda []string
	fw := 0
	for _, m := range mounts {
		switch base := path.Base(m.Destination); {
		case base == "nvidia-smi":
			smi = append(smi, m.Destination)
		case strings.HasPrefix(base, "libcuda.so."):
			cuda = append(cuda, path.Dir(m.Destination))
		case strings.Contains(m.Destination, "/firmware/"):
			fw++
		}
	}
	slices.Sort(cuda)
	cuda = slices.Compact(cuda)
	if len(smi) == 0 {
		smi = []string{"no nvidia-smi"}
	}
	return fmt.Sprintf("%s; libcuda in %s; %d firmware files", strings.Join(smi, ", "), strings.Join(cuda, ", "), fw)
}

// writeImage makes a glibc image: static busybox and ldconfig, the host's glibc (what
// NVIDIA's programs need), gpu-probe, and Debian's loader configuration.
func writeImage(t *testing.T, image, probe string) {
	t.Helper()
	const lib = "/lib/x86_64-linux-gnu"
	files := map[string]string{"/bin/busybox": "/bin/busybox", "/sbin/ldconfig": "/sbin/ldconfig", "/usr/bin/gpu-probe": probe}
	for _, l := range []string{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "ld-linux-x86-64.so.2"} {
		files[lib+"/"+l] = lib + "/" + l
	}
	for dst, src := range files {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Skipf("the image needs the host's %s: %v", src, err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(image, dst)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(image, dst), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"usr/lib", "lib64", "etc", "proc", "dev", "sys", "tmp", "usr/sbin", "usr/local/bin"} {
		if err := os.MkdirAll(filepath.Join(image, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []string{"sh", "grep", "cat"} {
		if err := os.Symlink("busybox", filepath.Join(image, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(lib+"/ld-linux-x86-64.so.2", filepath.Join(image, "lib64/ld-linux-x86-64.so.2")); err != nil {
		t.Fatal(err)
	}
	// Debian's loader configuration: an include of ld.so.conf.d, where the multiarch
	// directories are listed.
	if err := os.MkdirAll(filepath.Join(image, "etc/ld.so.conf.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(image, "etc/ld.so.conf"), []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(image, "etc/ld.so.conf.d/x86_64-linux-gnu.conf"), []byte(lib+"\n/usr"+lib+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// run copies image into a bundle, injects device from specDir as containerd does and
// runs script under runc. It returns the output and the container's mounts.
func run(ctx context.Context, t *testing.T, runc, image, bundle, specDir, device string) (string, []oci.Mount) {
	t.Helper()
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", image, filepath.Join(bundle, "rootfs")).CombinedOutput(); err != nil {
		t.Fatalf("copy the image: %v: %s", err, out)
	}
	ctr := &oci.Spec{
		Version: oci.Version,
		Root:    &oci.Root{Path: "rootfs"},
		Process: &oci.Process{Cwd: "/", Args: []string{"/bin/sh", "-c", script},
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
		Mounts: []oci.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		},
		Linux: &oci.Linux{Namespaces: []oci.LinuxNamespace{
			{Type: oci.MountNamespace}, {Type: oci.PIDNamespace}, {Type: oci.IPCNamespace}, {Type: oci.UTSNamespace}, {Type: oci.NetworkNamespace},
		}},
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.InjectDevices(ctr, device); err != nil {
		t.Fatalf("inject %s: %v (spec errors %v)", device, err, cache.GetErrors())
	}
	// No GPU on this machine: the device nodes the specs name do not exist.
	ctr.Linux.Devices = nil
	data, err := json.Marshal(ctr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	id := "nvinject-layouts-" + filepath.Base(bundle) + fmt.Sprint(os.Getpid())
	out, err := exec.CommandContext(ctx, runc, "--root", filepath.Join(bundle, "state"), "run", "--bundle", bundle, id).CombinedOutput()
	if err != nil {
		t.Fatalf("runc run %s: %v\n%s", device, err, out)
	}
	return string(out), ctr.Mounts
}
