package spec_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/shared/driverroot/driverroottest"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
)

// parityAllowlist is every container path NVIDIA's generator puts into a
// container that nvinject does not, and why.
var parityAllowlist = map[string]string{
	"/var/run/nvidia-container-devices/void": "a /dev/null marker for nvidia-container-runtime-hook's volume-mounts device list; " +
		"nvinject hands out CDI names only and stops that hook with NVIDIA_VISIBLE_DEVICES=void",
}

// envAllowlist is every environment variable of nvidia-ctk's spec that
// nvinject does not set, and why.
var envAllowlist = map[string]string{
	"NVIDIA_CTK_LIBCUDA_DIR": "informational for workloads; nothing in the toolkit reads it, and libcuda is found through ld.so.cache and the libcuda.so link",
}

// view is what a spec puts into a container, flattened for comparison.
type view struct {
	mounts     map[string]string // container path -> host path
	links      map[string]string // link -> target (create-symlinks)
	folders    []string          // update-ldcache --folder
	compat     string            // enable-cuda-compat --host-driver-version
	devices    []string          // device node paths of the "all" device and the common edits
	env        map[string]string
	extraHooks []string
}

func flatten(t *testing.T, s *specs.Spec) view {
	t.Helper()
	v := view{mounts: map[string]string{}, links: map[string]string{}, env: map[string]string{}}
	edits := []specs.ContainerEdits{s.ContainerEdits}
	for _, d := range s.Devices {
		if d.Name == "all" {
			edits = append(edits, d.ContainerEdits)
		}
	}
	for _, e := range edits {
		for _, m := range e.Mounts {
			if old, dup := v.mounts[m.ContainerPath]; dup {
				t.Errorf("%s is mounted twice (%s and %s)", m.ContainerPath, old, m.HostPath)
			}
			v.mounts[m.ContainerPath] = m.HostPath
		}
		for _, d := range e.DeviceNodes {
			v.devices = append(v.devices, d.Path)
		}
		for _, kv := range e.Env {
			k, val, _ := strings.Cut(kv, "=")
			v.env[k] = val
		}
		for _, h := range e.Hooks {
			if len(h.Args) < 2 {
				t.Fatalf("hook %+v has no command", h)
			}
			args := h.Args[2:]
			switch h.Args[1] {
			case spec.HookCreateSymlinks:
				for i := 0; i+1 < len(args); i += 2 {
					target, link, ok := strings.Cut(args[i+1], "::")
					if args[i] != "--link" || !ok {
						t.Fatalf("create-symlinks args %v", args)
					}
					v.links[link] = target
				}
			case spec.HookUpdateLDCache:
				for i := 0; i+1 < len(args); i += 2 {
					v.folders = append(v.folders, args[i+1])
				}
			case spec.HookEnableCUDACompat:
				v.compat = strings.TrimPrefix(args[0], "--host-driver-version=")
			default:
				v.extraHooks = append(v.extraHooks, h.Args[1])
			}
		}
	}
	slices.Sort(v.devices)
	return v
}

// file follows p through the spec's links to the mount that serves it and
// returns that host file; "" when p reaches nothing.
func (v view) file(p string) string {
	for range 16 {
		if h, ok := v.mounts[p]; ok {
			return h
		}
		t, ok := v.links[p]
		if !ok {
			return ""
		}
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = t
	}
	return ""
}

func category(p string) string {
	switch {
	case strings.HasPrefix(p, "/lib/firmware/"), strings.HasPrefix(p, "/usr/lib/firmware/"):
		return "firmware"
	case strings.HasPrefix(p, "/usr/bin/"), strings.HasPrefix(p, "/usr/sbin/"), strings.HasPrefix(p, "/bin/"):
		return "binaries"
	case strings.HasPrefix(p, "/run/"), strings.HasPrefix(p, "/var/run/"), strings.HasPrefix(p, "/tmp/"):
		return "ipc"
	case strings.Contains(path.Base(p), ".so"):
		return "libraries"
	}
	return "other"
}

func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// devRoot makes the device nodes nvidia-ctk's management mode looks for.
func devRoot(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("nvidia-ctk --mode=management needs device nodes; mknod needs root")
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, dev := range map[string][2]uint32{"nvidiactl": {195, 255}, "nvidia0": {195, 0}, "nvidia-uvm": {508, 0}, "nvidia-uvm-tools": {508, 1}} {
		if err := unix.Mknod(filepath.Join(dir, "dev", name), unix.S_IFCHR|0o666, int(unix.Mkdev(dev[0], dev[1]))); err != nil {
			t.Skipf("mknod %s: %v (nvidia-ctk --mode=management needs device nodes)", name, err)
		}
	}
	return dir
}

// TestParityWithNVIDIACTK compares nvinject's spec with NVIDIA's own
// generator's (nvidia-ctk cdi generate, pinned) on a REAL driver root (no
// kernel module), in both layouts: every file nvidia-ctk puts into a
// container, nvinject puts there too, as the same host file, or
// parityAllowlist says why not. With a hook binary the links must match;
// without one, each link nvidia-ctk makes must be a mount of the same file.
func TestParityWithNVIDIACTK(t *testing.T) {
	nvctk := driverroottest.NVCTK(t)
	dev := devRoot(t)
	hook := filepath.Join(t.TempDir(), "nvinject-cdi-hook")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, layout := range driverroottest.Layouts {
		t.Run(layout, func(t *testing.T) {
			root := driverroottest.Root(t, layout)
			out := filepath.Join(t.TempDir(), "nvidia-ctk.yaml")
			cmd := exec.Command(nvctk, "cdi", "generate", "--mode=management", "--driver-root="+root, "--dev-root="+dev, "--output="+out)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cmd, err, b)
			}
			theirs, err := cdi.ReadSpec(out, 0)
			if err != nil {
				t.Fatal(err)
			}
			b, err := backend.Open("sim:a100-80gb", backend.Options{DriverRoot: root})
			if err != nil {
				t.Fatal(err)
			}
			node, err := b.Discover(context.Background())
			b.Close()
			if err != nil {
				t.Fatal(err)
			}
			if node.DriverVersion != "535.261.03" {
				t.Fatalf("the simulation did not follow the real root: driver %s (%s)", node.DriverVersion, node.DriverSource)
			}
			nv := flatten(t, theirs.Spec)
			if len(nv.mounts) < 10 || len(nv.links) == 0 {
				t.Fatalf("nvidia-ctk's spec has %d mounts and %d links; it found no driver in %s", len(nv.mounts), len(nv.links), root)
			}
			for _, mode := range []struct {
				name string
				opts []spec.Option
			}{{"hooks", []spec.Option{spec.WithHookBinary(hook)}}, {"no-hooks", nil}} {
				t.Run(mode.name, func(t *testing.T) {
					s, err := spec.New(append([]spec.Option{spec.WithDriverRoot(root)}, mode.opts...)...).Generate(node, node.Devices)
					if err != nil {
						t.Fatal(err)
					}
					ours := flatten(t, s)
					compare(t, nv, ours, mode.name == "hooks")
				})
			}
		})
	}
}

func compare(t *testing.T, nv, ours view, hooks bool) {
	t.Helper()
	type row struct{ theirs, ours, allowed int }
	table := map[string]*row{}
	count := func(cat string) *row {
		if table[cat] == nil {
			table[cat] = &row{}
		}
		return table[cat]
	}
	paths := map[string]bool{}
	for p := range nv.mounts {
		paths[p] = true
	}
	for p := range nv.links {
		paths[p] = true
	}
	for p := range paths {
		r := count(category(p))
		r.theirs++
		if why, ok := parityAllowlist[p]; ok {
			r.allowed++
			t.Logf("allowlisted %s: %s", p, why)
			continue
		}
		want := nv.file(p)
		got := ours.file(p)
		switch {
		case got == "":
			t.Errorf("nvidia-ctk puts %s (%s) into the container; nvinject does not", p, want)
		case !sameFile(want, got):
			t.Errorf("%s: nvidia-ctk serves %s, nvinject %s", p, want, got)
		default:
			r.ours++
		}
		if _, isLink := nv.links[p]; isLink && hooks {
			if _, ok := ours.links[p]; !ok {
				t.Errorf("nvidia-ctk makes %s a symlink; nvinject's hook does not", p)
			}
		}
	}
	extra := map[string][]string{}
	for p := range ours.mounts {
		if !paths[p] {
			extra[category(p)] = append(extra[category(p)], p)
		}
	}
	for p := range ours.links {
		if !paths[p] {
			extra[category(p)] = append(extra[category(p)], p)
		}
	}
	for _, d := range nv.devices {
		r := count("device nodes")
		r.theirs++
		if slices.Contains(ours.devices, d) {
			r.ours++
		} else {
			t.Errorf("nvidia-ctk gives the device node %s; nvinject does not", d)
		}
	}
	for k, v := range nv.env {
		if why, ok := envAllowlist[k]; ok {
			t.Logf("allowlisted env %s: %s", k, why)
			continue
		}
		if ours.env[k] != v {
			t.Errorf("nvidia-ctk sets %s=%s; nvinject sets %q", k, v, ours.env[k])
		}
	}
	if hooks {
		for _, f := range nv.folders {
			if !slices.Contains(ours.folders, f) {
				t.Errorf("nvidia-ctk's update-ldcache indexes %s; nvinject's does not (%v)", f, ours.folders)
			}
		}
		if ours.compat != nv.compat {
			t.Errorf("enable-cuda-compat --host-driver-version: nvidia-ctk %q, nvinject %q", nv.compat, ours.compat)
		}
		if len(nv.extraHooks) > 0 {
			t.Errorf("nvidia-ctk runs hooks nvinject does not: %v", nv.extraHooks)
		}
	}
	cats := make([]string, 0, len(table))
	for c := range table {
		cats = append(cats, c)
	}
	sort.Strings(cats)
	var b strings.Builder
	fmt.Fprintf(&b, "%-13s %9s %9s %11s  %s\n", "category", "nvidia-ctk", "nvinject", "allowlisted", "nvinject only")
	for _, c := range cats {
		r := table[c]
		only := extra[c]
		sort.Strings(only)
		fmt.Fprintf(&b, "%-13s %9d %9d %11d  %d %v\n", c, r.theirs, r.ours, r.allowed, len(only), only)
	}
	fmt.Fprintf(&b, "ldcache folders: nvidia-ctk %v, nvinject %v; cuda compat: %q / %q\n", nv.folders, ours.folders, nv.compat, ours.compat)
	t.Logf("parity (paths a container gets):\n%s", b.String())
}

// realNode is the 8-GPU simulation following the real Debian-layout
// driver root, and its generator (with hooks).
func realNode(b *testing.B) (gpu.Node, *spec.Generator) {
	root := driverroottest.Root(b, "debian")
	be, err := backend.Open("sim:a100-80gb*8", backend.Options{DriverRoot: root})
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	node, err := be.Discover(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return node, spec.New(spec.WithDriverRoot(root), spec.WithHookBinary("/bin/true"))
}

// BenchmarkGenerate8GPUsRealRoot generates the spec of 8 simulated GPUs
// from the REAL driver root (Debian layout: every public name through
// /etc/alternatives, ELF sonames read); its anchor is
// BenchmarkAnchorReadSpecRealRoot.
func BenchmarkGenerate8GPUsRealRoot(b *testing.B) {
	node, g := realNode(b)
	for b.Loop() {
		if _, err := g.Generate(node, node.Devices); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAnchorReadSpecRealRoot reads and validates that spec through the
// CDI library, what containerd does whenever the spec dir changes.
func BenchmarkAnchorReadSpecRealRoot(b *testing.B) {
	node, g := realNode(b)
	s, err := g.Generate(node, node.Devices)
	if err != nil {
		b.Fatal(err)
	}
	p, _, err := spec.Write(b.TempDir(), s)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := cdi.ReadSpec(p, 0); err != nil {
			b.Fatal(err)
		}
	}
}
