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
// else what e2e/tools/build.sh --print-bin names.
func runc(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("NVINJECT_TOOLS_BIN")
	if dir == "" {
		if script, err := filepath.Abs("../../e2e/tools/build.sh"); err == nil {
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

// TestHooksUnderRunc runs a container with REAL runc from nvinject's spec
// for the REAL driver root (Debian layout) and the nvinject-cdi-hook built
// here: runc runs the three createContainer hooks inside the container's
// mount namespace, as it would on a node. Inside, libcuda.so.1 and
// libcuda.so lead to the mounted driver library, and afterwards the image's
// ld.so.cache lists the driver's libraries by soname.
func TestHooksUnderRunc(t *testing.T) {
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

	// An image: static busybox and nothing else (no ld.so.conf, no cache).
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
	for _, a := range []string{"sh", "readlink", "cat"} {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	const lib = "/usr/lib/x86_64-linux-gnu"
	ctr := &oci.Spec{
		Version: oci.Version,
		Root:    &oci.Root{Path: "rootfs"},
		Process: &oci.Process{
			Cwd:  "/",
			Env:  []string{"PATH=/bin"},
			Args: []string{"/bin/sh", "-c", "for l in " + lib + "/libcuda.so.1 " + lib + "/libcuda.so " + lib + "/nvidia/current/libcuda.so; do readlink -f $l; done && cat /etc/ld.so.conf.d/00-nvinject-driver.conf"},
		},
		Mounts: []oci.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
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
	cmd := exec.Command(rc, "--root", filepath.Join(dir, "runc-state"), "run", "--bundle", bundle, id)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("runc run: %v\n%s", err, out)
	}
	t.Logf("in the container:\n%s", out)
	file := lib + "/nvidia/current/libcuda.so.535.261.03"
	for _, want := range []string{file + "\n" + file + "\n" + file + "\n", lib + "\n" + lib + "/nvidia/current\n"} {
		if !strings.Contains(string(out), want) {
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
