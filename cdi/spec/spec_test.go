package spec_test

import (
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/cdi/driver"
	"github.com/nvinject/nvinject/cdi/simulation/simtest"
	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

var update = flag.Bool("update", false, "rewrite golden files")

// simNode is a simulated node and its driver root; the root's path has a
// fixed last element so golden files can replace the temp prefix.
func simNode(t testing.TB, value string) (gpu.Node, string) {
	t.Helper()
	dir := t.TempDir()
	return simtest.DriverRoot(t, value, dir), filepath.Join(dir, "driver-root")
}

func TestGolden(t *testing.T) {
	for _, tc := range []struct{ value, golden string }{
		{"sim:a100-80gb", "a100-80gb-1.yaml"},
		{"sim:a100-80gb*8", "a100-80gb-8.yaml"},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			node, root := simNode(t, tc.value)
			s, err := spec.New(spec.WithDriverRoot(root)).Generate(node, node.Devices)
			if err != nil {
				t.Fatal(err)
			}
			got, err := yaml.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			got = []byte(strings.ReplaceAll(string(got), root, "/DRIVER-ROOT"))
			path := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update once to create it)", err)
			}
			if string(got) != string(want) {
				t.Errorf("spec differs from %s; rerun with -update if intended:\n%s", path, got)
			}
		})
	}
}

// The spec must resolve through the CDI library exactly as containerd
// resolves it, giving the GPU's node, the control nodes, the driver
// mounts and the UUID env, and nothing of other GPUs.
func TestInjectThroughCDICache(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb*8")
	g := spec.New(spec.WithDriverRoot(root))
	s, err := g.Generate(node, node.Devices)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, _, err := spec.Write(dir, s); err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	want := node.Devices[3]
	ociSpec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := cache.InjectDevices(ociSpec, g.QualifiedName(want.UUID))
	if err != nil || len(unresolved) > 0 {
		t.Fatalf("inject: %v, unresolved %v", err, unresolved)
	}
	var gpuNodes, ctl []string
	for _, d := range ociSpec.Linux.Devices {
		if d.Major == gpu.NVIDIAMajor && d.Minor < gpu.ModesetMinor {
			gpuNodes = append(gpuNodes, d.Path)
		} else {
			ctl = append(ctl, d.Path)
		}
	}
	if !slices.Equal(gpuNodes, []string{"/dev/nvidia3"}) {
		t.Errorf("GPU nodes = %v, want only /dev/nvidia3", gpuNodes)
	}
	slices.Sort(ctl)
	if !slices.Equal(ctl, []string{"/dev/nvidia-modeset", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"}) {
		t.Errorf("control nodes = %v", ctl)
	}
	env := ociSpec.Process.Env
	for _, e := range []string{spec.UUIDEnv(want.Minor) + "=" + want.UUID, "NVIDIA_VISIBLE_DEVICES=void", contract.EnvSimulated + "=1"} {
		if !slices.Contains(env, e) {
			t.Errorf("env %v lacks %s", env, e)
		}
	}
	for _, e := range env {
		if strings.HasPrefix(e, contract.EnvUUIDPrefix) && e != spec.UUIDEnv(want.Minor)+"="+want.UUID {
			t.Errorf("env names another GPU: %s", e)
		}
	}
	var mounts []string
	for _, m := range ociSpec.Mounts {
		mounts = append(mounts, m.Destination)
	}
	for _, m := range []string{"/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so." + sim.DriverVersion, "/usr/bin/nvidia-smi", "/lib/firmware/nvidia/" + sim.DriverVersion + "/gsp_ga10x.bin", driver.SimulatedFacts} {
		if !slices.Contains(mounts, m) {
			t.Errorf("mounts lack %s: %v", m, mounts)
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(mounts)))) != len(mounts) {
		t.Errorf("a container path is mounted twice: %v", mounts)
	}
}

func TestWriteOnlyOnChange(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb")
	dir := t.TempDir()
	s, err := spec.New(spec.WithDriverRoot(root)).Generate(node, node.Devices)
	if err != nil {
		t.Fatal(err)
	}
	p, changed, err := spec.Write(dir, s)
	if err != nil || !changed {
		t.Fatalf("first write: changed=%v err=%v", changed, err)
	}
	st1, _ := os.Stat(p)
	if _, changed, err = spec.Write(dir, s); err != nil || changed {
		t.Fatalf("identical write: changed=%v err=%v", changed, err)
	}
	st2, _ := os.Stat(p)
	if !st1.ModTime().Equal(st2.ModTime()) {
		t.Error("identical spec rewrote the file")
	}
	node8, root8 := simNode(t, "sim:a100-80gb*8")
	s8, err := spec.New(spec.WithDriverRoot(root8)).Generate(node8, node8.Devices)
	if err != nil {
		t.Fatal(err)
	}
	if _, changed, err = spec.Write(dir, s8); err != nil || !changed {
		t.Fatalf("changed GPU set: changed=%v err=%v", changed, err)
	}
}

func TestGenerateErrors(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb*2")
	noCache := t.TempDir()
	if err := os.CopyFS(noCache, os.DirFS(root)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(noCache, "etc/ld.so.cache")); err != nil {
		t.Fatal(err)
	}
	wrongVersion := node
	wrongVersion.DriverVersion = "999.1"
	stranger := gpu.Device{UUID: "GPU-00000000-0000-0000-0000-000000000000"}
	for _, tc := range []struct {
		name    string
		node    gpu.Node
		root    string
		devs    []gpu.Device
		wantErr string
		is      error
	}{
		{"missing driver root", node, filepath.Join(root, "nope"), node.Devices, "--driver-root", driver.ErrNoDriverRoot},
		{"driver version mismatch", wrongVersion, root, node.Devices, "NVML reports 999.1 (SIMULATED, sim:a100-80gb*2 default) but the driver root " + root + " holds " + sim.DriverVersion + " (/usr/lib/x86_64-linux-gnu/libnvidia-ml.so." + sim.DriverVersion + "); pass --nvml=sim:<model>,driver=" + sim.DriverVersion, driver.ErrVersionMismatch},
		{"unknown GPU", node, root, []gpu.Device{stranger}, "not on this node", nil},
		{"duplicate GPU", node, root, []gpu.Device{node.Devices[0], node.Devices[0]}, "listed twice", nil},
		{"no GPUs", node, root, nil, "NVIDIA_VISIBLE_DEVICES", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := spec.New(spec.WithDriverRoot(tc.root)).Generate(tc.node, tc.devs)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want errors.Is %v", err, tc.is)
			}
		})
	}
	// Without an ld.so.cache the libraries are found in their directories.
	if _, err := spec.New(spec.WithDriverRoot(noCache)).Generate(node, node.Devices); err != nil {
		t.Errorf("a root without ld.so.cache: %v", err)
	}
}

func TestHostDriverRootAndHook(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb")
	hook := filepath.Join(t.TempDir(), "nvinject-cdi-hook")
	if err := os.WriteFile(hook, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := spec.New(spec.WithDriverRoot(root), spec.WithHostDriverRoot("/host"), spec.WithHookBinary(hook), spec.WithNameStrategy(spec.NameIndex)).Generate(node, node.Devices)
	if err != nil {
		t.Fatal(err)
	}
	lib := "/usr/lib/x86_64-linux-gnu/"
	for _, m := range s.ContainerEdits.Mounts {
		if !strings.HasPrefix(m.HostPath, "/host/") {
			t.Errorf("mount %s does not use the host driver root", m.HostPath)
		}
		if strings.HasPrefix(m.ContainerPath, lib) && !strings.HasSuffix(m.ContainerPath, "."+sim.DriverVersion) {
			t.Errorf("with hooks, the link %s is a mount, not a symlink the hook makes", m.ContainerPath)
		}
	}
	var cmds []string
	for _, h := range s.ContainerEdits.Hooks {
		if h.HookName != "createContainer" || h.Path != hook || h.Args[0] != "nvinject-cdi-hook" {
			t.Errorf("hook %+v does not run %s at createContainer", h, hook)
		}
		if !slices.Equal(h.Env, []string{"PATH=/usr/bin:/bin"}) {
			t.Errorf("hook %v has env %q, want PATH=/usr/bin:/bin alone (no runtime may hand it the container's)", h.Args, h.Env)
		}
		cmds = append(cmds, h.Args[1])
		args := strings.Join(h.Args, " ")
		switch h.Args[1] {
		case spec.HookCreateSymlinks:
			for _, l := range []string{"libcuda.so.1::" + lib + "libcuda.so", "libcuda.so." + sim.DriverVersion + "::" + lib + "libcuda.so.1", "libnvidia-nvvm.so." + sim.DriverVersion + "::" + lib + "libnvidia-nvvm.so.4"} {
				if !strings.Contains(args, "--link "+l) {
					t.Errorf("create-symlinks lacks --link %s: %s", l, args)
				}
			}
		case spec.HookEnableCUDACompat:
			if !slices.Contains(h.Args, "--host-driver-version="+sim.DriverVersion) {
				t.Errorf("enable-cuda-compat: %s", args)
			}
		case spec.HookUpdateLDCache:
			if !strings.HasSuffix(args, "--folder /usr/lib/x86_64-linux-gnu") {
				t.Errorf("update-ldcache: %s", args)
			}
		}
	}
	if !slices.Equal(cmds, []string{spec.HookCreateSymlinks, spec.HookEnableCUDACompat, spec.HookUpdateLDCache}) {
		t.Errorf("hooks run %v, want create-symlinks, enable-cuda-compat, update-ldcache in that order", cmds)
	}
	var names []string
	for _, d := range s.Devices {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{node.Devices[0].UUID, "0", "all"}) {
		t.Errorf("device names = %v", names)
	}
	for _, bad := range []string{"/nonexistent/hook", "relative/hook", root} {
		if _, err := spec.New(spec.WithDriverRoot(root), spec.WithHookBinary(bad)).Generate(node, node.Devices); err == nil || !strings.Contains(err.Error(), "--hook-binary") {
			t.Errorf("hook binary %q: err = %v", bad, err)
		}
	}
}

// The runtime runs the hook program as root for every container: a
// program, or a directory above it, that another user could write is
// refused; a sticky /tmp above it is not.
func TestHookBinaryMustBeTrusted(t *testing.T) {
	node, root := simNode(t, "sim:a100-80gb")
	dir := t.TempDir()
	hook := filepath.Join(dir, "nvinject-cdi-hook")
	if err := os.WriteFile(hook, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	gen := func() error {
		_, err := spec.New(spec.WithDriverRoot(root), spec.WithHookBinary(hook)).Generate(node, node.Devices)
		return err
	}
	if err := gen(); err != nil {
		t.Fatalf("a hook of this user's, mode 0755, in a private directory: %v", err)
	}
	for _, tc := range []struct {
		path string
		mode os.FileMode
	}{{hook, 0o777}, {hook, 0o775}, {dir, 0o777}} {
		if err := os.Chmod(tc.path, tc.mode); err != nil {
			t.Fatal(err)
		}
		if err := gen(); err == nil || !strings.Contains(err.Error(), "someone other than root") {
			t.Errorf("%s mode %v: err = %v", tc.path, tc.mode, err)
		}
		if err := os.Chmod(tc.path, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(hook, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := gen(); err == nil || !strings.Contains(err.Error(), "uid 65534") {
			t.Errorf("a hook owned by nobody: err = %v", err)
		}
	}
}

// Two processes given the same --nvml value must write the same spec: the
// daemons and tools agree about one simulated node only if UUIDs are stable.
func TestCLIDeterministicAcrossProcesses(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("linux only")
	}
	bin := filepath.Join(t.TempDir(), "nvinject-cdi")
	build := exec.Command("go", "build", "-o", bin, "../cmd/nvinject-cdi")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	root := filepath.Join(t.TempDir(), "root")
	smi := filepath.Join(t.TempDir(), "smi")
	if err := os.WriteFile(smi, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "simulate-driver-root", "--nvml=sim:a100-80gb", "--smi", smi, root).CombinedOutput(); err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	var specs [2][]byte
	for i := range specs {
		out, err := exec.Command(bin, "generate", "--nvml=sim:a100-80gb", "--driver-root="+root, "--output=-").Output()
		if err != nil {
			t.Fatalf("generate %d: %v", i, err)
		}
		specs[i] = out
	}
	if string(specs[0]) != string(specs[1]) {
		t.Fatal("two processes generated different specs")
	}
	if !strings.Contains(string(specs[0]), sim.UUID("a100-80gb", 0)) {
		t.Fatal("spec lacks the deterministic simulated UUID")
	}
	f := filepath.Join(t.TempDir(), "spec.yaml")
	if err := os.WriteFile(f, specs[0], 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "validate", f).CombinedOutput(); err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}

	// driver= that the root does not hold: refused, naming both and why.
	out, err := exec.Command(bin, "generate", "--nvml=sim:a100-80gb,driver=535.261.03", "--driver-root="+root, "--output=-").CombinedOutput()
	want := "NVML reports 535.261.03 (SIMULATED, the driver= option of sim:a100-80gb,driver=535.261.03) but the driver root " + root + " holds " + sim.DriverVersion
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("mismatched driver=: err %v, output %s; want %q", err, out, want)
	}
	// The old --ldcache-hook still works, says it is deprecated, and runs every hook.
	out, err = exec.Command(bin, "generate", "--nvml=sim:a100-80gb", "--driver-root="+root, "--ldcache-hook="+smi, "--output=-").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--ldcache-hook is deprecated") || !strings.Contains(string(out), "- "+spec.HookUpdateLDCache) || !strings.Contains(string(out), "- "+spec.HookCreateSymlinks) {
		t.Errorf("--ldcache-hook: err %v, output %s", err, out)
	}
}

func BenchmarkGenerate8GPUs(b *testing.B) {
	node, root := simNode(b, "sim:a100-80gb*8")
	g := spec.New(spec.WithDriverRoot(root))
	b.ResetTimer()
	for b.Loop() {
		if _, err := g.Generate(node, node.Devices); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAnchorReadSpec is the anchor for BenchmarkGenerate8GPUs: reading
// and validating the same 8-GPU spec through the CDI library, the work
// containerd does whenever the spec dir changes.
func BenchmarkAnchorReadSpec(b *testing.B) {
	node, root := simNode(b, "sim:a100-80gb*8")
	s, err := spec.New(spec.WithDriverRoot(root)).Generate(node, node.Devices)
	if err != nil {
		b.Fatal(err)
	}
	p, _, err := spec.Write(b.TempDir(), s)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := cdi.ReadSpec(p, 0); err != nil {
			b.Fatal(err)
		}
	}
}
