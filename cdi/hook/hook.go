package hook

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nvinject/nvinject/shared/contract"
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
// bundle's config.json (relative to the bundle when not absolute). A root
// that is the host's / or, when relative, leaves the bundle is refused.
func ContainerRoot(r io.Reader) (string, error) {
	root, _, err := containerRoot(r)
	return root, err
}

// OpenContainerRoot is ContainerRoot, then OpenRoot, refusing a relative
// root whose directory, links followed, is not under the bundle's.
func OpenContainerRoot(r io.Reader) (*Root, error) {
	root, bundle, err := containerRoot(r)
	if err != nil {
		return nil, err
	}
	cr, err := OpenRoot(root)
	if err != nil || bundle == "" {
		return cr, err
	}
	real, err := cr.RealPath()
	if err == nil {
		var realBundle string
		if realBundle, err = filepath.EvalSymlinks(bundle); err == nil && !under(real, realBundle) {
			err = fmt.Errorf("it resolves to %s, outside the bundle %s", contract.Quote(real), contract.Quote(realBundle))
		}
	}
	if err != nil {
		cr.Close()
		return nil, fmt.Errorf("the container root %s, relative to the bundle: %w; refusing to work on it", contract.Quote(root), err)
	}
	return cr, nil
}

// under reports whether p is dir or inside it.
func under(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// containerRoot returns the root and, when the root is relative to the
// bundle, the bundle.
func containerRoot(r io.Reader) (root, bundle string, err error) {
	data, err := readAtMost(r, "the OCI state on stdin", maxState)
	if err != nil {
		return "", "", fmt.Errorf("%w; a hook is run by the container runtime, which writes the state there", err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return "", "", fmt.Errorf("parse the OCI state on stdin: %w; this program is an OCI createContainer hook: the container runtime runs it with the state on stdin", err)
	}
	if s.Root != "" {
		return absRoot(s.Root, s.Bundle)
	}
	if s.Bundle == "" {
		return "", "", errors.New("the OCI state on stdin has no bundle; cannot find the container's root file system")
	}
	config := filepath.Join(s.Bundle, "config.json")
	cfg, err := readFile(config, maxConfig)
	if err != nil {
		return "", "", fmt.Errorf("read the bundle's config.json: %w", err)
	}
	var spec struct {
		Root *struct {
			Path string `json:"path"`
		} `json:"root"`
	}
	if err := json.Unmarshal(cfg, &spec); err != nil {
		return "", "", fmt.Errorf("parse %s: %w", contract.Quote(config), err)
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return "", "", fmt.Errorf("%s has no root.path; cannot find the container's root file system", contract.Quote(config))
	}
	return absRoot(spec.Root.Path, s.Bundle)
}

func absRoot(p, bundle string) (string, string, error) {
	if strings.ContainsRune(p, 0) {
		return "", "", fmt.Errorf("the container root %s holds a NUL byte", contract.Quote(p))
	}
	if filepath.IsAbs(p) {
		bundle = ""
	} else {
		if !filepath.IsAbs(bundle) {
			return "", "", fmt.Errorf("the container root %s is relative and the OCI state's bundle %s is not an absolute path", contract.Quote(p), contract.Quote(bundle))
		}
		bundle = filepath.Clean(bundle)
		if p = filepath.Join(bundle, p); !under(p, bundle) {
			return "", "", fmt.Errorf("the container root %s leaves the bundle %s; refusing to work on it", contract.Quote(p), contract.Quote(bundle))
		}
	}
	p = filepath.Clean(p)
	if p == "/" {
		return "", "", errors.New("the container's root file system is the host's /; refusing to change it")
	}
	return p, bundle, nil
}

// ParseLink splits a --link value "target::link"; link must be absolute
// and name something below the root, target must not be empty, neither
// may hold a NUL or be longer than PATH_MAX.
func ParseLink(v string) (target, link string, err error) {
	target, link, ok := strings.Cut(v, "::")
	if !ok || target == "" || !path.IsAbs(link) || path.Clean(link) == "/" || strings.Contains(link, "::") || strings.ContainsRune(v, 0) || len(target) >= unix.PathMax || len(link) >= unix.PathMax {
		return "", "", fmt.Errorf("--link=%s is not TARGET::LINK with an absolute LINK (such as libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so)", contract.Quote(v))
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
// compatibility directory. enable-cuda-compat writes it when compat is on
// and removes it otherwise, so a copy the image ships never counts.
const CompatConf = "/etc/ld.so.conf.d/00-nvinject-cuda-compat.conf"

// maxCompatEntries bounds the compat directory's listing.
const maxCompatEntries = 4096

// EnableCUDACompat adds the image's CUDA forward compatibility libraries
// (compatDir/libcuda.so.<version>, from the cuda-compat package) to the
// loader's path when the host's driver should use them: when the library's
// .note.cuda.fwd_compatibility ELF note lists hostDriver's branch and the
// library is newer than hostDriver, or, without that note, when its major
// version is above hostDriver's (nvidia-cdi-hook's rules). It reports
// whether it did. Otherwise, or with an empty hostDriver, it removes
// CompatConf, whoever wrote it.
func EnableCUDACompat(r *Root, hostDriver, compatDir string) (bool, error) {
	if !path.IsAbs(compatDir) || strings.ContainsAny(compatDir, "\x00\n") {
		return false, fmt.Errorf("--cuda-compat-container-root=%s is not an absolute path", contract.Quote(compatDir))
	}
	compatDir = path.Clean(compatDir)
	if hostDriver == "" {
		return false, r.Remove(CompatConf)
	}
	host, ok := parseVersion(hostDriver)
	if !ok {
		return false, fmt.Errorf("--host-driver-version=%s is not a driver version such as 535.261.03", contract.Quote(hostDriver))
	}
	if !useCompat(r, host, compatDir) {
		return false, r.Remove(CompatConf)
	}
	return true, r.WriteFile(CompatConf, []byte(compatDir+"\n"))
}

func useCompat(r *Root, host []int, compatDir string) bool {
	ents, err := r.ReadDir(compatDir, maxCompatEntries)
	if err != nil {
		return false
	}
	var libs []string
	for _, e := range ents {
		if v, ok := strings.CutPrefix(e.Name(), "libcuda.so."); ok && strings.Contains(v, ".") && e.Type().IsRegular() {
			libs = append(libs, e.Name())
		}
	}
	if len(libs) != 1 {
		return false
	}
	compat, ok := parseVersion(strings.TrimPrefix(libs[0], "libcuda.so."))
	if !ok {
		return false
	}
	use := compat[0] > host[0]
	if branches, found := compatBranches(r, path.Join(compatDir, libs[0])); found {
		use = slices.Contains(branches, host[0]) && slices.Compare(compat, host) > 0
	}
	return use
}

// compatBranches reads the host driver branches a CUDA compat libcuda
// supports from its .note.cuda.fwd_compatibility ELF note (NVIDIA's JSON
// {"Driver": [535, 550, ...]}); found is false without a readable note.
func compatBranches(r *Root, p string) (branches []int, found bool) {
	f, err := r.openRegular(p)
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
