package hostile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nvinject/nvinject/cdi/simulation/simtest"
	"github.com/nvinject/nvinject/cdi/spec"
)

// repo is the repository root, from this package's directory.
const repo = "../../.."

// suite is what every run shares: built once per test binary.
type suite struct {
	runcs     []prog
	ldconfigs []prog
	hooks     []hookProg
	busybox   []byte
	payload   []byte // a shared library whose constructor writes $PWN_TARGET
	victimLib []byte // an ELF library with a soname and no soname link
}

type prog struct{ name, path string }

type hookProg struct {
	name  string
	path  string
	hooks []oci.Hook // the spec's createContainer hooks, calling this program
}

// script runs a repository builder script that prints a directory last.
func script(t *testing.T, rel string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(repo, rel), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w: %s", rel, err, lastLines(stderr.String(), 3))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1], nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

var (
	setupOnce sync.Once
	shared    *suite
	setupErr  string
	// work holds the programs built for this test binary.
	work string
)

func TestMain(m *testing.M) {
	var err error
	if work, err = os.MkdirTemp("", "nvinject-hostile-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(work)
	os.Exit(code)
}

func setup(t *testing.T) *suite {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runc and the hooks need root")
	}
	setupOnce.Do(func() { shared, setupErr = build(t) })
	if setupErr != "" {
		t.Skip(setupErr)
	}
	return shared
}

// build gathers the programs; a missing one skips the suite with what to
// do, a broken build fails it.
func build(t *testing.T) (*suite, string) {
	s := &suite{}
	dir := work
	var err error
	tools := os.Getenv("NVINJECT_TOOLS_BIN")
	if tools == "" {
		if tools, err = script(t, "e2e/harness/tools/build.sh", "--print-bin"); err != nil {
			return nil, err.Error()
		}
	}
	if _, err := os.Stat(filepath.Join(tools, "runc")); err != nil {
		return nil, "no pinned runc: run `make tools` (or set NVINJECT_TOOLS_BIN)"
	}
	compat, err := script(t, "e2e/harness/tools/runc-compat.sh")
	if err != nil {
		return nil, "no runc before 1.3: " + err.Error()
	}
	s.runcs = []prog{{"runc 1.4.4", filepath.Join(tools, "runc")}, {"runc 1.2.6", filepath.Join(compat, "runc")}}

	nv, err := script(t, "e2e/harness/nvctk/build.sh")
	if err != nil {
		return nil, "no nvidia-cdi-hook: " + err.Error()
	}
	ours := filepath.Join(dir, "nvinject-cdi-hook")
	b := exec.Command("go", "build", "-o", ours, filepath.Join(repo, "cdi/cmd/nvinject-cdi-hook"))
	b.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := b.CombinedOutput(); err != nil {
		t.Fatalf("build nvinject-cdi-hook: %v\n%s", err, out)
	}

	// The hooks exactly as nvinject's generator writes them for a node,
	// once naming each program.
	node := simtest.DriverRoot(t, "sim:a100-80gb", filepath.Join(dir, "sim"))
	for _, h := range []struct{ name, path string }{{"nvinject-cdi-hook", ours}, {"nvidia-cdi-hook", filepath.Join(nv, "nvidia-cdi-hook")}} {
		sp, err := spec.New(spec.WithDriverRoot(filepath.Join(dir, "sim/driver-root")), spec.WithHookBinary(h.path)).Generate(node, node.Devices)
		if err != nil {
			t.Fatal(err)
		}
		hp := hookProg{name: h.name, path: h.path}
		for _, hk := range sp.ContainerEdits.Hooks {
			oh := oci.Hook{Path: hk.Path, Args: hk.Args, Env: hk.Env}
			if h.name == "nvidia-cdi-hook" {
				// The env NVIDIA's own generator gives every hook.
				oh.Env = []string{"NVIDIA_CTK_DEBUG=false"}
			}
			hp.hooks = append(hp.hooks, oh)
		}
		if len(hp.hooks) != 3 {
			t.Fatalf("the spec runs %d hooks, want create-symlinks, enable-cuda-compat, update-ldcache", len(hp.hooks))
		}
		s.hooks = append(s.hooks, hp)
	}

	// ldconfig: the host's static one, and Ubuntu's arrangement, where
	// /sbin/ldconfig is a /bin/sh script exec'ing /sbin/ldconfig.real
	// (NVIDIA's hook runs the .real one when it exists).
	ubuntu := filepath.Join(dir, "ubuntu")
	real, err := os.ReadFile("/sbin/ldconfig")
	if err != nil {
		return nil, "no /sbin/ldconfig on this host"
	}
	if err := os.MkdirAll(ubuntu, 0o755); err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(ubuntu, "ldconfig")
	if err := errors.Join(os.WriteFile(wrapper+".real", real, 0o755), os.WriteFile(wrapper, []byte("#!/bin/sh\nexec "+wrapper+".real \"$@\"\n"), 0o755)); err != nil {
		t.Fatal(err)
	}
	s.ldconfigs = []prog{{"static", "/sbin/ldconfig"}, {"sh wrapper", wrapper}}

	if s.busybox, err = os.ReadFile("/bin/busybox"); err != nil {
		return nil, "no static /bin/busybox for the images: apt-get install busybox-static"
	}
	src := filepath.Join(dir, "pwn.c")
	so := filepath.Join(dir, "pwn.so")
	const payload = `#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void pwn(void) {
	const char *p = getenv("PWN_TARGET");
	if (p == NULL) return;
	int fd = open(p, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd >= 0) { write(fd, "image code ran on the host as root\n", 35); close(fd); }
}
`
	if err := os.WriteFile(src, []byte(payload), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-o", so, src).CombinedOutput(); err != nil {
		return nil, fmt.Sprintf("no C compiler for the LD_PRELOAD payload (apt-get install gcc): %v: %s", err, out)
	}
	if s.payload, err = os.ReadFile(so); err != nil {
		t.Fatal(err)
	}
	libs, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/libz.so.1.*")
	if len(libs) == 0 {
		return nil, "no host libz.so.1 to plant as the victim library"
	}
	if s.victimLib, err = os.ReadFile(libs[0]); err != nil {
		t.Fatal(err)
	}
	return s, ""
}

// run is one container: its bundle, root and the host directory its
// attacks aim at.
type run struct {
	t                  *testing.T
	bundle, root, host string
}

// procHost is how a path of the host is reached from inside the
// container while the hooks run: runc has mounted the container's procfs
// at ROOT/proc, and pid 1 there (runc init, before pivot_root) has the
// host's / as its root.
func (r *run) procHost(p string) string { return "/proc/1/root" + filepath.Join(r.host, p) }

func (r *run) file(p string, data []byte, mode fs.FileMode) {
	r.t.Helper()
	full := filepath.Join(r.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(full, data, mode); err != nil {
		r.t.Fatal(err)
	}
}

func (r *run) link(p, target string) {
	r.t.Helper()
	full := filepath.Join(r.root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		r.t.Fatal(err)
	}
	_ = os.RemoveAll(full)
	if err := os.Symlink(target, full); err != nil {
		r.t.Fatal(err)
	}
}

// hostileCase is one crafted image.
type hostileCase struct {
	name   string
	escape string // the escape it reproduces, "" for none
	env    []string
	build  func(s *suite, r *run)
}

var cases = []hostileCase{
	{name: "benign image (control: every hook runs)", build: func(*suite, *run) {}},
	{name: "compat drop-in holds ldconfig options (-r HOST -C FILE)", escape: "1", build: func(_ *suite, r *run) {
		r.file("etc/ld.so.conf.d/00-nvinject-cuda-compat.conf", []byte("-r "+filepath.Join(r.host, "target")+" -X -C /victim.cache\n"), 0o644)
	}},
	{name: "ld.so.conf lists /proc/1/root/HOST/libs", escape: "2", build: func(_ *suite, r *run) {
		r.file("etc/ld.so.conf", []byte("include /etc/ld.so.conf.d/*.conf\n"+r.procHost("libs")+"\n"), 0o644)
	}},
	{name: "/var/cache/ldconfig links to /proc/1/root/HOST/aux", escape: "2", build: func(_ *suite, r *run) {
		r.link("var/cache/ldconfig", r.procHost("aux"))
	}},
	{name: "LD_PRELOAD of an image library in the container's env", escape: "3", env: []string{"LD_PRELOAD=./pwn.so"}, build: func(s *suite, r *run) {
		r.file("pwn.so", s.payload, 0o755)
	}},
	{name: "/etc links to /proc/1/root/HOST/etc", build: func(_ *suite, r *run) {
		r.link("etc", r.procHost("etc"))
	}},
	{name: "/etc is an absolute link to HOST/etc", build: func(_ *suite, r *run) {
		r.link("etc", filepath.Join(r.host, "etc"))
	}},
	{name: "/etc climbs out with ../ to HOST/etc", build: func(_ *suite, r *run) {
		r.link("etc", strings.Repeat("../", 16)+strings.TrimPrefix(filepath.Join(r.host, "etc"), "/"))
	}},
	{name: "ld.so.cache and ld.so.conf.d link to HOST through /proc/1/root", build: func(_ *suite, r *run) {
		r.link("etc/ld.so.cache", r.procHost("victim.cache"))
		r.link("etc/ld.so.conf.d", r.procHost("etc"))
	}},
	{name: "driver library directory links to /proc/1/root/HOST/libs", build: func(_ *suite, r *run) {
		r.link("usr/lib/x86_64-linux-gnu", r.procHost("libs"))
	}},
	{name: "CUDA compat directory links to /proc/1/root/HOST/compat", build: func(_ *suite, r *run) {
		r.link("usr/local/cuda/compat", r.procHost("compat"))
	}},
	{name: "libraries link to HOST files; a device node and a FIFO named as libraries", build: func(_ *suite, r *run) {
		r.link("usr/lib/x86_64-linux-gnu/libpwn.so.1", r.procHost("libs/libpwn.so.1.0"))
		r.link("usr/lib/x86_64-linux-gnu/libabs.so.1", filepath.Join(r.host, "libs/libpwn.so.1.0"))
		dir := filepath.Join(r.root, "usr/lib/x86_64-linux-gnu")
		if err := mknod(filepath.Join(dir, "libdev.so.1"), filepath.Join(dir, "libfifo.so.1")); err != nil {
			r.t.Fatal(err)
		}
	}},
}

// hostTree is what every run's host directory holds before the hooks run:
// a target directory, a library without its soname link, an aux-cache
// directory, an etc with an ld.so.conf, a compat library, a victim file.
func hostTree(s *suite, r *run) {
	r.t.Helper()
	for p, data := range map[string][]byte{
		"target/keep":                []byte("keep\n"),
		"libs/libpwn.so.1.0":         s.victimLib,
		"aux/keep":                   []byte("keep\n"),
		"etc/ld.so.conf":             []byte("/host-only\n"),
		"compat/libcuda.so.999.1.1":  nil,
		"victim.cache":               []byte("the host's file\n"),
		"etc/ld.so.conf.d/host.conf": []byte("/host-only\n"),
		"preload/keep":               []byte("keep\n"),
	} {
		full := filepath.Join(r.host, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
}

// image writes the base every case starts from: static busybox as /bin,
// a Debian-like loader configuration.
func image(s *suite, r *run) {
	r.file("bin/busybox", s.busybox, 0o755)
	for _, a := range []string{"true", "sh"} {
		r.link("bin/"+a, "busybox")
	}
	r.file("etc/ld.so.conf", []byte("include /etc/ld.so.conf.d/*.conf\n"), 0o644)
	r.file("etc/ld.so.conf.d/x86_64-linux-gnu.conf", []byte("/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"), 0o644)
	if err := os.MkdirAll(filepath.Join(r.root, "proc"), 0o555); err != nil {
		r.t.Fatal(err)
	}
}

// snapshot is Snapshot, failing t on an error.
func snapshot(t *testing.T, dir string) Tree {
	t.Helper()
	tree, err := Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

// outcome is one hook program's result on one case.
type outcome struct {
	status  string   // "ran", "refused" or "runtime error"
	detail  string   // the hook's error, short
	output  string   // what the runtime and the hook printed
	escaped []string // what changed outside the root
}

func (o outcome) String() string {
	if len(o.escaped) > 0 {
		return "ESCAPED: " + strings.Join(o.escaped[:min(3, len(o.escaped))], ", ")
	}
	if o.status == "refused" {
		return "inside (hook refused: " + o.detail + ")"
	}
	return "inside (" + o.status + ")"
}

// runCase creates the case's container under runc with the hooks of h
// and ldconfig ld, and reports what happened.
func runCase(t *testing.T, s *suite, c hostileCase, rc, ld prog, h hookProg) outcome {
	t.Helper()
	dir := t.TempDir()
	r := &run{t: t, bundle: filepath.Join(dir, "bundle"), root: filepath.Join(dir, "bundle/rootfs"), host: filepath.Join(dir, "host")}
	hostTree(s, r)
	image(s, r)
	c.build(s, r)
	env := append([]string{"PATH=/bin"}, c.env...)
	env = append(env, "PWN_TARGET="+filepath.Join(r.host, "preload/ran"))
	var hooks []oci.Hook
	for _, hk := range h.hooks {
		hk.Args = slices.Clone(hk.Args)
		if slices.Contains(hk.Args, spec.HookUpdateLDCache) {
			hk.Args = append(hk.Args, "--ldconfig-path="+ld.path)
		}
		hooks = append(hooks, hk)
	}
	config := &oci.Spec{
		Version: oci.Version,
		Root:    &oci.Root{Path: "rootfs"},
		Process: &oci.Process{Cwd: "/", Env: env, Args: []string{"/bin/true"}},
		Mounts:  []oci.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Hooks:   &oci.Hooks{CreateContainer: hooks},
		Linux: &oci.Linux{Namespaces: []oci.LinuxNamespace{
			{Type: oci.MountNamespace}, {Type: oci.PIDNamespace}, {Type: oci.IPCNamespace}, {Type: oci.UTSNamespace}, {Type: oci.NetworkNamespace},
		}},
	}
	data, err := json.Marshal(config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, r.host)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	state := filepath.Join(dir, "runc")
	id := "nvinject-hostile-" + filepath.Base(dir)
	out, err := exec.CommandContext(ctx, rc.path, "--root", state, "run", "--bundle", r.bundle, id).CombinedOutput()
	_ = exec.Command(rc.path, "--root", state, "delete", "-f", id).Run()
	o := outcome{status: "ran", escaped: before.Changes(snapshot(t, r.host))}
	if err != nil {
		o.status, o.detail = "runtime error", lastLines(string(out), 1)
		if strings.Contains(string(out), "createContainer") || strings.Contains(string(out), "hook") {
			o.status, o.detail = "refused", hookError(string(out))
		}
	}
	if ctx.Err() != nil {
		t.Errorf("%s under %s: runc did not finish in a minute:\n%s", c.name, rc.name, out)
	}
	return o
}

// hookError cuts runc's report of a failed hook to the hook's own words.
func hookError(out string) string {
	line := lastLines(out, 1)
	for _, mark := range []string{"nvinject-cdi-hook: ", "stderr: "} {
		if i := strings.LastIndex(line, mark); i >= 0 {
			line = line[i+len(mark):]
		}
	}
	line = strings.TrimSuffix(strings.Trim(line, `"\ `), `\n`)
	if len(line) > 90 {
		line = line[:90] + "…"
	}
	return line
}

func mknod(dev, fifo string) error {
	if err := os.MkdirAll(filepath.Dir(dev), 0o755); err != nil {
		return err
	}
	// /dev/full's numbers: harmless if opened, and the hook must not.
	if out, err := exec.Command("mknod", dev, "c", "1", "7").CombinedOutput(); err != nil {
		return fmt.Errorf("mknod: %v: %s", err, out)
	}
	if out, err := exec.Command("mkfifo", fifo).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfifo: %v: %s", err, out)
	}
	return nil
}

// TestHostileImages runs every case under each runc, with each ldconfig,
// for both hook programs. nvinject-cdi-hook must keep every case inside
// its root; NVIDIA's results are reported beside it.
func TestHostileImages(t *testing.T) {
	s := setup(t)
	type row struct {
		c       hostileCase
		rc, ld  string
		results []outcome
	}
	var rows []row
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, rc := range s.runcs {
				for _, ld := range s.ldconfigs {
					rw := row{c: c, rc: rc.name, ld: ld.name}
					for _, h := range s.hooks {
						o := runCase(t, s, c, rc, ld, h)
						rw.results = append(rw.results, o)
						if h.name == "nvinject-cdi-hook" && len(o.escaped) > 0 {
							t.Errorf("%s, %s ldconfig: %s reached the host: %s", rc.name, ld.name, h.name, strings.Join(o.escaped, "; "))
						}
						if strings.HasPrefix(c.name, "benign") && h.name == "nvinject-cdi-hook" && o.status != "ran" {
							t.Errorf("%s, %s ldconfig: %s did not run on a benign image: %s %s", rc.name, ld.name, h.name, o.status, o.detail)
						}
						if o.status == "runtime error" {
							t.Errorf("%s, %s ldconfig, %s: runc failed before the hooks, so the case tested nothing: %s", rc.name, ld.name, h.name, o.detail)
						}
					}
					rows = append(rows, rw)
				}
			}
		})
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "case\tescape\truntime\tldconfig\t%s\t%s\n", s.hooks[0].name, s.hooks[1].name)
	for _, rw := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", rw.c.name, rw.c.escape, rw.rc, rw.ld, rw.results[0], rw.results[1])
	}
	w.Flush()
	t.Logf("hostile images, each hook run by runc as a createContainer hook; \"inside\" = nothing outside the container root changed:\n%s", b.String())
}

// TestRootIsTheHostRoot hands each hook program, run as runc would run
// it (the OCI state on stdin), a container root that is the host's /:
// a bundle rootfs that links to /, one climbing there with ../, and a
// state naming / as crun's root. runc refuses a linked rootfs itself, but
// a hook must not rely on its runtime. Run in a decoy host (a chroot in
// its own mount and PID namespaces) so a hook that works on / changes the
// decoy, never this machine. nvinject-cdi-hook must refuse every one.
func TestRootIsTheHostRoot(t *testing.T) {
	s := setup(t)
	unshare, err1 := exec.LookPath("unshare")
	chroot, err2 := exec.LookPath("chroot")
	if err := errors.Join(err1, err2); err != nil {
		t.Skipf("no unshare or chroot (util-linux, coreutils): %v", err)
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "root\t%s\t%s\n", s.hooks[0].name, s.hooks[1].name)
	for _, rc := range []struct{ name, link, state string }{
		{"bundle rootfs -> /", "/", `{"ociVersion":"1.2.0","id":"c","status":"creating","bundle":"/bundle"}`},
		{"bundle rootfs -> ../../..", "../../..", `{"ociVersion":"1.2.0","id":"c","status":"creating","bundle":"/bundle"}`},
		{"state root /bundle/.. (crun)", "rootfs-unused", `{"ociVersion":"1.2.0","id":"c","status":"creating","bundle":"/bundle","root":"/bundle/.."}`},
	} {
		fmt.Fprintf(w, "%s", rc.name)
		for _, h := range s.hooks {
			o := runInDecoy(t, unshare, chroot, h, rc.link, rc.state)
			fmt.Fprintf(w, "\t%s", o)
			if h.name == "nvinject-cdi-hook" && (len(o.escaped) > 0 || !strings.Contains(o.output, "refusing")) {
				t.Errorf("%s: %s worked on the host's /: %s", rc.name, h.name, o)
			}
		}
		fmt.Fprintln(w)
	}
	w.Flush()
	t.Logf("a container root that is the host's /, each hook run in a decoy host:\n%s", b.String())
}

// runInDecoy builds a decoy host holding the hook program (and what it
// links to), the host's static ldconfig and a bundle whose rootfs is link,
// runs the spec's three hooks there with state on stdin, and reports what
// changed in the decoy.
func runInDecoy(t *testing.T, unshare, chroot string, h hookProg, link, state string) outcome {
	t.Helper()
	decoy := t.TempDir()
	copyFile := func(src, dst string, mode fs.FileMode) {
		t.Helper()
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		full := filepath.Join(decoy, dst)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(h.path, "/bin/hook", 0o755)
	copyFile("/sbin/ldconfig", "/sbin/ldconfig", 0o755)
	if out, err := exec.Command("ldd", h.path).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				copyFile(f, f, 0o755)
			}
		}
	}
	for p, data := range map[string]string{"etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n", "etc/ld.so.conf.d/host.conf": "/usr/lib/x86_64-linux-gnu\n", "usr/lib/x86_64-linux-gnu/keep": "keep\n", "bundle/config.json": `{"root":{"path":"rootfs"}}`} {
		full := filepath.Join(decoy, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(os.Mkdir(filepath.Join(decoy, "proc"), 0o555), os.Symlink(link, filepath.Join(decoy, "bundle/rootfs"))); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, decoy)
	o := outcome{status: "ran"}
	for _, hk := range h.hooks {
		args := append([]string{"--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc=" + filepath.Join(decoy, "proc"), chroot, decoy, "/bin/hook"}, hk.Args[1:]...)
		cmd := exec.Command(unshare, args...)
		cmd.Env = hk.Env
		cmd.Stdin = strings.NewReader(state)
		out, err := cmd.CombinedOutput()
		if err != nil {
			o.status, o.detail, o.output = "refused", hookError(string(out)), string(out)
			break
		}
	}
	after := snapshot(t, decoy)
	delete(before, "/proc")
	delete(after, "/proc")
	o.escaped = before.Changes(after)
	return o
}
