package hook_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/cdi/ldcache"
	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/shared/driverroot/driverroottest"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// runc finds the pinned runc the local node uses: $NVINJECT_TOOLS_BIN,
// else what e2e/harness/tools/build.sh --print-bin names.
func runc(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("NVINJECT_TOOLS_BIN")
	if dir == "" {
		if script, err := filepath.Abs("../../e2e/harness/tools/build.sh"); err == nil {
			if out, err := exec.Command(script, "--print-bin").Output(); err == nil {
				dir = strings.TrimSpace(string(out))
			}
		}
	}
	p := filepath.Join(dir, "runc")
	if _, err := os.Stat(p); dir == "" || err != nil {
		t.Skip("no runc: run `make tools` (or set NVINJECT_TOOLS_BIN)")
	}
	return p
}

// hookContainer runs args in a runc container the way a node would give
// it a GPU: nvinject's spec for the REAL driver root (Debian layout) with
// the nvinject-cdi-hook built here, injected as containerd injects a CDI
// device, so runc runs the three createContainer hooks in the container's
// mount namespace. fill writes the image into the root file system first.
// It returns what the container printed and the root file system.
func hookContainer(t *testing.T, fill func(rootfs string), env []string, args ...string) (string, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runc needs root")
	}
	rc := runc(t)
	root := driverroottest.Root(t, "debian")
	dir := t.TempDir()
	hookBin := filepath.Join(dir, "nvinject-cdi-hook")
	build := exec.Command("go", "build", "-o", hookBin, "../cmd/nvinject-cdi-hook")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the hook: %v\n%s", err, out)
	}

	be, err := backend.Open("sim:a100-80gb", backend.Options{DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	node, err := be.Discover(context.Background())
	be.Close()
	if err != nil {
		t.Fatal(err)
	}
	g := spec.New(spec.WithDriverRoot(root), spec.WithHookBinary(hookBin))
	s, err := g.Generate(node, node.Devices)
	if err != nil {
		t.Fatal(err)
	}
	specDir := filepath.Join(dir, "cdi")
	if _, _, err := spec.Write(specDir, s); err != nil {
		t.Fatal(err)
	}

	bundle := filepath.Join(dir, "bundle")
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skipf("no static busybox for the image: %v", err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin/busybox"), bb, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"sh", "readlink", "cat", "grep"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	fill(rootfs)
	ctr := &oci.Spec{
		Version: oci.Version,
		Root:    &oci.Root{Path: "rootfs"},
		Process: &oci.Process{Cwd: "/", Env: env, Args: args},
		Mounts:  []oci.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux: &oci.Linux{Namespaces: []oci.LinuxNamespace{
			{Type: oci.MountNamespace}, {Type: oci.PIDNamespace}, {Type: oci.IPCNamespace}, {Type: oci.UTSNamespace}, {Type: oci.NetworkNamespace},
		}},
	}
	// What containerd does with a CDI name: inject the spec's edits.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.InjectDevices(ctr, g.QualifiedName(node.Devices[0].UUID)); err != nil {
		t.Fatal(err)
	}
	ctr.Linux.Devices = nil // no GPU nodes on this machine; the hooks need none
	data, err := json.Marshal(ctr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	id := "nvinject-hook-test-" + filepath.Base(dir)
	out, err := exec.Command(rc, "--root", filepath.Join(dir, "runc-state"), "run", "--bundle", bundle, id).CombinedOutput()
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	t.Logf("in the container:\n%s", out)
	return string(out), rootfs
}

// TestHooksUnderRunc: in an image of static busybox and nothing else (no
// ld.so.conf, no cache), libcuda.so.1 and libcuda.so lead to the mounted
// driver library, and afterwards the image's ld.so.cache lists the
// driver's libraries by soname.
func TestHooksUnderRunc(t *testing.T) {
	const lib = "/usr/lib/x86_64-linux-gnu"
	out, rootfs := hookContainer(t, func(string) {}, []string{"PATH=/bin"}, "/bin/sh", "-c",
		"for l in "+lib+"/libcuda.so.1 "+lib+"/libcuda.so "+lib+"/nvidia/current/libcuda.so; do readlink -f $l; done && cat /etc/ld.so.conf.d/00-nvinject-driver.conf")
	file := lib + "/nvidia/current/libcuda.so.535.261.03"
	for _, want := range []string{file + "\n" + file + "\n" + file + "\n", lib + "\n" + lib + "/nvidia/current\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("container output lacks %q:\n%s", want, out)
		}
	}
	cacheData, err := os.ReadFile(filepath.Join(rootfs, "etc/ld.so.cache"))
	if err != nil {
		t.Fatalf("update-ldcache wrote no ld.so.cache in the image: %v", err)
	}
	entries, err := ldcache.Parse(cacheData)
	if err != nil {
		t.Fatal(err)
	}
	for _, soname := range []string{"libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4"} {
		if !slices.ContainsFunc(entries, func(e ldcache.Entry) bool { return e.Name == soname }) {
			t.Errorf("the image's ld.so.cache lacks %s: %+v", soname, entries)
		}
	}
}

// TestLoaderUsesTheHookCache: glibc's own loader and ldconfig read the
// cache update-ldcache writes. In an image of the host's glibc (the
// libraries NVIDIA's need), its static ldconfig and gpu-probe, with no
// LD_LIBRARY_PATH, `ldconfig -p` lists the driver's libraries and the
// image's own, and gpu-probe dlopen()s libcuda.so.1, libcuda.so,
// libnvidia-ml.so.1, libnvidia-ptxjitcompiler.so.1 and libnvidia-nvvm.so.4
// by name, each found through the cache.
func TestLoaderUsesTheHookCache(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runc needs root")
	}
	probe := filepath.Join(t.TempDir(), "gpu-probe")
	if out, err := exec.Command("go", "build", "-o", probe, "../../e2e/cmd/gpu-probe").CombinedOutput(); err != nil {
		t.Skipf("build gpu-probe (cgo): %v\n%s", err, out)
	}
	glibc := []string{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "ld-linux-x86-64.so.2"}
	fill := func(rootfs string) {
		copyTo := func(src, dst string, mode os.FileMode) {
			data, err := os.ReadFile(src)
			if err != nil {
				t.Skipf("host %s: %v", src, err)
			}
			if err := os.MkdirAll(filepath.Dir(filepath.Join(rootfs, dst)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(rootfs, dst), data, mode); err != nil {
				t.Fatal(err)
			}
		}
		for _, l := range glibc {
			copyTo("/lib/x86_64-linux-gnu/"+l, "/lib/x86_64-linux-gnu/"+l, 0o755)
		}
		copyTo("/sbin/ldconfig", "/sbin/ldconfig", 0o755)
		copyTo(probe, "/usr/bin/gpu-probe", 0o755)
		if err := os.MkdirAll(filepath.Join(rootfs, "lib64"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", filepath.Join(rootfs, "lib64/ld-linux-x86-64.so.2")); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(rootfs, "etc/ld.so.conf.d"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(rootfs, "etc/ld.so.conf"), []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := hookContainer(t, fill, []string{"PATH=/bin:/sbin:/usr/bin"}, "/bin/sh", "-c", "ldconfig -p; echo ===; gpu-probe --json")
	cache, probeOut, _ := strings.Cut(out, "===\n")
	for _, want := range []string{
		"libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"libcuda.so (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so",
		"libnvidia-ml.so.1 (libc6,x86-64) => ",
		"libc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6",
		"Cache generated by: nvinject-cdi-hook",
	} {
		if !strings.Contains(cache, want) {
			t.Errorf("ldconfig -p in the container lacks %q:\n%s", want, cache)
		}
	}
	var r struct {
		Libraries []struct {
			Name, RealPath, Error string
			OK                    bool
		} `json:"libraries"`
		AllLoaded bool `json:"all_loaded"`
	}
	if err := json.Unmarshal([]byte(probeOut), &r); err != nil {
		t.Fatalf("gpu-probe --json: %v\n%s", err, probeOut)
	}
	if !r.AllLoaded || len(r.Libraries) != 5 {
		t.Errorf("gpu-probe: all_loaded=%v with %d libraries", r.AllLoaded, len(r.Libraries))
	}
	for _, l := range r.Libraries {
		if !l.OK || !strings.HasSuffix(l.RealPath, ".so.535.261.03") {
			t.Errorf("gpu-probe: %s ok=%v real path %s: %s", l.Name, l.OK, l.RealPath, l.Error)
		}
	}
}
