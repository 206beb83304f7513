package hook

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Limits on what a hook reads.
const (
	maxState  = 1 << 20
	maxConfig = 32 << 20
)

// State is the part of the OCI state (given on a hook's stdin) a hook
// needs. Root is crun's non-standard extension naming the rootfs directly.
type State struct {
	ID     string `json:"id"`
	Bundle string `json:"bundle"`
	Root   string `json:"root,omitempty"`
}

// ContainerRoot reads the OCI state from r and returns the container's
// root file system on the host: the state's root, else root.path of the
// bundle's config.json (relative to the bundle when not absolute).
func ContainerRoot(r io.Reader) (string, error) {
	data, err := readAtMost(r, "the OCI state on stdin", maxState)
	if err != nil {
		return "", fmt.Errorf("%w; a hook is run by the container runtime, which writes the state there", err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return "", fmt.Errorf("parse the OCI state on stdin: %w; this program is an OCI createContainer hook: the container runtime runs it with the state on stdin", err)
	}
	if s.Root != "" {
		return absRoot(s.Root, s.Bundle)
	}
	if s.Bundle == "" {
		return "", errors.New("the OCI state on stdin has no bundle; cannot find the container's root file system")
	}
	cfg, err := readFile(filepath.Join(s.Bundle, "config.json"), maxConfig)
	if err != nil {
		return "", fmt.Errorf("read the bundle's config.json: %w", err)
	}
	var spec struct {
		Root *struct {
			Path string `json:"path"`
		} `json:"root"`
	}
	if err := json.Unmarshal(cfg, &spec); err != nil {
		return "", fmt.Errorf("parse %s: %w", filepath.Join(s.Bundle, "config.json"), err)
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return "", fmt.Errorf("%s has no root.path; cannot find the container's root file system", filepath.Join(s.Bundle, "config.json"))
	}
	return absRoot(spec.Root.Path, s.Bundle)
}

func absRoot(p, bundle string) (string, error) {
	if !filepath.IsAbs(p) {
		if !filepath.IsAbs(bundle) {
			return "", fmt.Errorf("the container root %q is relative and the OCI state's bundle %q is not an absolute path", p, bundle)
		}
		p = filepath.Join(bundle, p)
	}
	p = filepath.Clean(p)
	if p == "/" {
		return "", errors.New("the container's root file system is the host's /; refusing to change it")
	}
	return p, nil
}

// ParseLink splits a --link value "target::link"; link must be absolute.
func ParseLink(v string) (target, link string, err error) {
	target, link, ok := strings.Cut(v, "::")
	if !ok || target == "" || !path.IsAbs(link) || strings.Contains(link, "::") {
		return "", "", fmt.Errorf("--link=%q is not TARGET::LINK with an absolute LINK (such as libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so)", v)
	}
	return target, path.Clean(link), nil
}

// CreateSymlinks makes each "target::link" symlink inside the root.
func CreateSymlinks(r *Root, links []string) error {
	for _, l := range links {
		target, link, err := ParseLink(l)
		if err != nil {
			return err
		}
		if err := r.Symlink(target, link); err != nil {
			return err
		}
	}
	return nil
}

// CompatConf is the ld.so.conf.d drop-in naming the image's CUDA forward
// compatibility directory; "00-" sorts it before the driver's folders.
const CompatConf = "/etc/ld.so.conf.d/00-nvinject-cuda-compat.conf"

// EnableCUDACompat adds the image's CUDA forward compatibility libraries
// (compatDir/libcuda.so.<version>, from the cuda-compat package) to the
// loader's path when the host's driver should use them: when the library's
// .note.cuda.fwd_compatibility ELF note lists hostDriver's branch and the
// library is newer than hostDriver, or, without that note, when its major
// version is above hostDriver's (nvidia-cdi-hook's rules). It reports
// whether it did.
func EnableCUDACompat(r *Root, hostDriver, compatDir string) (bool, error) {
	host, ok := parseVersion(hostDriver)
	if !ok {
		return false, fmt.Errorf("--host-driver-version=%q is not a driver version such as 535.261.03", hostDriver)
	}
	ents, err := r.ReadDir(compatDir)
	if err != nil {
		return false, nil
	}
	var libs []string
	for _, e := range ents {
		if v, ok := strings.CutPrefix(e.Name(), "libcuda.so."); ok && strings.Contains(v, ".") && e.Type().IsRegular() {
			libs = append(libs, e.Name())
		}
	}
	if len(libs) != 1 {
		return false, nil
	}
	compat, ok := parseVersion(strings.TrimPrefix(libs[0], "libcuda.so."))
	if !ok {
		return false, nil
	}
	use := compat[0] > host[0]
	if branches, found := compatBranches(r, path.Join(compatDir, libs[0])); found {
		use = slices.Contains(branches, host[0]) && slices.Compare(compat, host) > 0
	}
	if !use {
		return false, nil
	}
	return true, r.WriteFile(CompatConf, []byte(path.Clean(compatDir)+"\n"))
}

// compatBranches reads the host driver branches a CUDA compat libcuda
// supports from its .note.cuda.fwd_compatibility ELF note (NVIDIA's JSON
// {"Driver": [535, 550, ...]}); found is false without a readable note.
func compatBranches(r *Root, p string) (branches []int, found bool) {
	f, err := r.open(p, unix.O_RDONLY|unix.O_NOCTTY)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, false
	}
	defer ef.Close()
	sec := ef.Section(".note.cuda.fwd_compatibility")
	if sec == nil || sec.Type != elf.SHT_NOTE || sec.Size > 1<<16 {
		return nil, false
	}
	data, err := sec.Data()
	if err != nil || len(data) < 12 {
		return nil, false
	}
	nameSize, descSize := ef.ByteOrder.Uint32(data[0:]), ef.ByteOrder.Uint32(data[4:])
	align := func(n uint32) uint64 { return (uint64(n) + 3) &^ 3 }
	start := 12 + align(nameSize)
	if uint64(len(data)) < start+uint64(descSize) || !strings.HasPrefix(string(data[12:]), "NVIDIA Corporation") {
		return nil, false
	}
	var note struct {
		Driver []int `json:"Driver"`
	}
	if err := json.Unmarshal(bytes.Trim(data[start:start+uint64(descSize)], "\x00"), &note); err != nil {
		return nil, false
	}
	return note.Driver, true
}

// parseVersion splits a driver version into its numbers (535.261.03 ->
// [535 261 3]).
func parseVersion(v string) ([]int, bool) {
	var out []int
	for f := range strings.SplitSeq(v, ".") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, false
		}
		out = append(out, n)
	}
	return out, len(out) >= 2 && out[0] > 0
}

// DriverConf is the ld.so.conf.d drop-in listing the driver's folders.
const DriverConf = "/etc/ld.so.conf.d/00-nvinject-driver.conf"

// systemDirs are the library directories distributions' ldconfig trusts
// without listing them; the host's ldconfig may trust others, so those the
// image has are passed explicitly.
var systemDirs = []string{"/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib", "/usr/lib"}

// LDConfigTimeout bounds one ldconfig run.
const LDConfigTimeout = 30 * time.Second

// UpdateLDCache records folders in the image's ld.so.conf.d and rebuilds
// its /etc/ld.so.cache with the host's ldconfig run as `ldconfig -r ROOT`:
// ldconfig chroots into the container root before reading anything, so the
// image's links resolve inside it, and no program of the image runs.
func UpdateLDCache(ctx context.Context, r *Root, ldconfig string, folders []string) ([]byte, error) {
	for _, f := range folders {
		if !path.IsAbs(f) {
			return nil, fmt.Errorf("--folder=%q is not an absolute path", f)
		}
	}
	if len(folders) > 0 {
		if err := r.WriteFile(DriverConf, []byte(strings.Join(folders, "\n")+"\n")); err != nil {
			return nil, err
		}
	}
	if !r.Exists("/etc/ld.so.conf") {
		if err := r.WriteFile("/etc/ld.so.conf", []byte("include /etc/ld.so.conf.d/*.conf\n")); err != nil {
			return nil, err
		}
	}
	dirs := slices.Clone(folders)
	if conf, err := r.ReadFile(CompatConf, 4096); err == nil {
		dirs = append(strings.Fields(string(conf)), dirs...)
	}
	for _, d := range systemDirs {
		if r.Exists(d) && !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, LDConfigTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, ldconfig, append([]string{"-r", r.Path()}, dirs...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s -r %s: %w: %s", ldconfig, r.Path(), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// readFile reads the host file p, at most limit bytes.
func readFile(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readAtMost(f, p, limit)
}

// readAtMost reads r to its end, refusing more than limit bytes: a hook
// reads what a container or its runtime wrote. what names r in the error.
func readAtMost(r io.Reader, what string, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", what, limit)
	}
	return data, nil
}

// InstallName is the hook program's file name in an install directory.
const InstallName = "nvinject-cdi-hook"

// Install copies the program at self into dir as InstallName (mode 0755),
// atomically, so a node's runtime never runs a half-written hook. The
// device plugin's DaemonSet runs it in an init container to put the hook
// on the host.
func Install(self, dir string) (string, error) {
	data, err := os.ReadFile(self)
	if err != nil {
		return "", fmt.Errorf("read the hook program %s: %w", self, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create the install directory %s: %w", dir, err)
	}
	dst := filepath.Join(dir, InstallName)
	tmp, err := os.CreateTemp(dir, "."+InstallName+"-*")
	if err != nil {
		return "", fmt.Errorf("install into %s: %w", dir, err)
	}
	_, werr := tmp.Write(data)
	if err := errors.Join(werr, tmp.Chmod(0o755), tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("install into %s: %w", dir, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("install into %s: %w", dir, err)
	}
	return dst, nil
}
