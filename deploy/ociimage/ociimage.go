// Package ociimage writes OCI image archives from host files, so the local node can
// import images (`ctr images import`) without Docker, a registry or umoci. An image is
// one layer of added files, on top of a root filesystem tar (WithBaseLayer) if given.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"
)

// epoch gives every file the same mtime so equal inputs give equal digests.
var epoch = time.Unix(0, 0).UTC()

type entry struct {
	hostPath string // empty for symlinks and directories
	link     string
	mode     int64
	dir      bool // an explicit directory (AddTree), with mode
}

// Image collects the files of one image and its runtime config.
type Image struct {
	ref        string
	files      map[string]entry // keyed by absolute image path
	entrypoint []string
	cmd        []string
	env        []string
	workdir    string
	user       string
	labels     map[string]string
	ldd        string
	base       string // root filesystem tar, the first layer; "" for none
}

// Option configures an Image.
type Option func(*Image)

// WithEntrypoint sets the image's entrypoint.
func WithEntrypoint(args ...string) Option { return func(i *Image) { i.entrypoint = args } }

// WithCmd sets the image's default arguments.
func WithCmd(args ...string) Option { return func(i *Image) { i.cmd = args } }

// WithEnv adds KEY=VALUE pairs to the image's environment.
func WithEnv(kv ...string) Option { return func(i *Image) { i.env = append(i.env, kv...) } }

// WithWorkingDir sets the image's working directory.
func WithWorkingDir(dir string) Option { return func(i *Image) { i.workdir = dir } }

// WithUser sets the user the image runs as by default ("65532:65532").
func WithUser(u string) Option { return func(i *Image) { i.user = u } }

// WithLabels adds image config labels (org.opencontainers.image.version, …).
func WithLabels(l map[string]string) Option {
	return func(i *Image) {
		if i.labels == nil {
			i.labels = map[string]string{}
		}
		for k, v := range l {
			i.labels[k] = v
		}
	}
}

// WithLdd names the ldd program used by AddBinary (default "ldd").
func WithLdd(p string) Option { return func(i *Image) { i.ldd = p } }

// WithBaseLayer makes the root filesystem tar at tarPath (uncompressed, e.g. the one
// e2e/harness/bookworm/build.sh makes) the image's first layer, as it is. The added files form
// the second layer; their parent directories resolve through the base's symlinks
// (/lib -> usr/lib in a merged-/usr Debian), so an added file never replaces such a link
// with a directory, and directories the base has keep their entries there.
func WithBaseLayer(tarPath string) Option { return func(i *Image) { i.base = tarPath } }

// New starts an image that will be tagged ref (e.g. "registry.k8s.io/pause:3.10.1").
func New(ref string, opts ...Option) *Image {
	img := &Image{ref: ref, files: map[string]entry{}, ldd: "ldd",
		env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
	for _, o := range opts {
		o(img)
	}
	return img
}

// AddFile copies hostPath to imagePath, keeping its permission bits.
func (img *Image) AddFile(hostPath, imagePath string) error {
	st, err := os.Stat(hostPath)
	if err != nil {
		return fmt.Errorf("add %s to image: %w", hostPath, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("add %s to image: not a regular file", hostPath)
	}
	img.files[clean(imagePath)] = entry{hostPath: hostPath, mode: int64(st.Mode().Perm())}
	return nil
}

// AddSymlink adds imagePath as a symlink to target (e.g. /bin/sh -> busybox).
func (img *Image) AddSymlink(imagePath, target string) {
	img.files[clean(imagePath)] = entry{link: target}
}

// AddTree adds the tree under hostDir at imageDir: regular files with their permission
// bits, symlinks as they are (targets not rewritten), directories with their modes.
// Other file types (devices, sockets) are an error.
func (img *Image) AddTree(hostDir, imageDir string) error {
	return filepath.WalkDir(hostDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("add tree %s: %w", hostDir, err)
		}
		rel, err := filepath.Rel(hostDir, p)
		if err != nil {
			return err
		}
		dst := clean(path.Join(imageDir, filepath.ToSlash(rel)))
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("add tree %s: %w", hostDir, err)
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("add tree %s: %w", hostDir, err)
			}
			img.AddSymlink(dst, target)
		case d.IsDir():
			if dst != "/" {
				img.files[dst] = entry{dir: true, mode: int64(info.Mode().Perm())}
			}
		case d.Type().IsRegular():
			img.files[dst] = entry{hostPath: p, mode: int64(info.Mode().Perm())}
		default:
			return fmt.Errorf("add tree %s: %s is a %v, not a file, directory or symlink", hostDir, p, d.Type())
		}
		return nil
	})
}

// lddLine matches "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the
// loader's "/lib64/ld-linux-x86-64.so.2 (0x...)".
var lddLine = regexp.MustCompile(`(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)`)

// AddBinary adds a program plus the shared libraries ldd reports for it, at their host
// paths, so dynamically linked (cgo) programs run in an otherwise empty image.
func (img *Image) AddBinary(hostPath, imagePath string) error {
	if err := img.AddFile(hostPath, imagePath); err != nil {
		return err
	}
	out, err := exec.Command(img.ldd, hostPath).CombinedOutput()
	if err != nil {
		// ldd fails on static binaries; they need nothing else.
		if strings.Contains(string(out), "not a dynamic executable") || strings.Contains(string(out), "statically linked") {
			return nil
		}
		return fmt.Errorf("ldd %s: %w: %s", hostPath, err, out)
	}
	for _, m := range lddLine.FindAllStringSubmatch(string(out), -1) {
		lib := m[1]
		if err := img.addLibrary(lib); err != nil {
			return err
		}
	}
	return nil
}

// addLibrary adds lib under its own path, following symlinks so the soname link and the
// real file both exist in the image.
func (img *Image) addLibrary(lib string) error {
	for range 8 {
		st, err := os.Lstat(lib)
		if err != nil {
			return fmt.Errorf("library %s reported by ldd: %w", lib, err)
		}
		if st.Mode()&os.ModeSymlink == 0 {
			return img.AddFile(lib, lib)
		}
		target, err := os.Readlink(lib)
		if err != nil {
			return fmt.Errorf("read link %s: %w", lib, err)
		}
		img.AddSymlink(lib, target)
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(lib), target)
		}
		lib = target
	}
	return fmt.Errorf("library %s: too many symlinks", lib)
}

// FileList is the image's own files (not the base layer's), one line each:
// mode, path and, for a symlink, its target; sorted by path.
func (img *Image) FileList() []string {
	out := make([]string, 0, len(img.files))
	for p, e := range img.files {
		switch {
		case e.link != "":
			out = append(out, fmt.Sprintf("l 0777 %s -> %s", p, e.link))
		case e.dir:
			out = append(out, fmt.Sprintf("d %04o %s", e.mode, p))
		default:
			out = append(out, fmt.Sprintf("f %04o %s", e.mode, p))
		}
	}
	sort.Slice(out, func(i, j int) bool { return strings.Fields(out[i])[2] < strings.Fields(out[j])[2] })
	return out
}

// WriteArchive writes the image as an OCI image layout tar to w.
func (img *Image) WriteArchive(w io.Writer) error {
	var base *baseLayer
	if img.base != "" {
		var err error
		if base, err = readBase(img.base); err != nil {
			return err
		}
	}
	layer, err := img.layer(base)
	if err != nil {
		return err
	}
	layerDigest := digest(layer)
	diffIDs := []string{layerDigest}
	layers := []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer)}
	if base != nil {
		diffIDs = append([]string{base.digest}, diffIDs...)
		layers = append([]any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar",
			"digest": base.digest, "size": base.size}}, layers...)
	}
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": img.entrypoint, "Cmd": img.cmd, "Env": img.env, "WorkingDir": img.workdir,
			"User": img.user, "Labels": img.labels,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": diffIDs},
		"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "nvinject-image"}},
	})
	if err != nil {
		return fmt.Errorf("encode image config: %w", err)
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config),
		"layers":        layers,
	})
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	md["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	md["annotations"] = map[string]string{
		// containerd names the imported image after this annotation.
		"io.containerd.image.name":          img.ref,
		"org.opencontainers.image.ref.name": tagOf(img.ref),
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{md},
	})
	if err != nil {
		return fmt.Errorf("encode index: %w", err)
	}
	tw := tar.NewWriter(w)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(manifest), manifest},
		{blobPath(config), config},
		{blobPath(layer), layer},
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch}); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epoch}); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return fmt.Errorf("write archive: %w", err)
		}
	}
	if base != nil {
		if err := base.writeBlob(tw); err != nil {
			return err
		}
	}
	return tw.Close()
}

// WriteArchiveFile writes the archive to path.
func (img *Image) WriteArchiveFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create image archive: %w", err)
	}
	if err := img.WriteArchive(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// layer builds the tar of the added files, creating parent directories for every entry
// that the base (nil for none) does not already have.
func (img *Image) layer(base *baseLayer) ([]byte, error) {
	files := img.files
	if base != nil {
		files = map[string]entry{}
		for p, e := range img.files {
			r, err := base.resolveParent(p)
			if err != nil {
				return nil, err
			}
			files[r] = e
		}
	}
	dirs := map[string]bool{}
	names := make([]string, 0, len(files))
	for p, e := range files {
		if !e.dir {
			names = append(names, p)
		}
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if base != nil && base.dirs[d] {
				continue
			}
			dirs[d] = true
		}
	}
	for p, e := range files {
		if e.dir {
			dirs[p] = true
		}
	}
	for d := range dirs {
		if e, ok := files[d]; ok && !e.dir {
			return nil, fmt.Errorf("image path %s is both a file and a directory", d)
		}
		if base != nil && base.links[d] != "" {
			return nil, fmt.Errorf("image path %s is a symlink in the base layer and a directory here", d)
		}
		names = append(names, d)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		name := strings.TrimPrefix(p, "/")
		if dirs[p] {
			mode := int64(0o755)
			if e, ok := files[p]; ok && e.dir {
				mode = e.mode
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: epoch}); err != nil {
				return nil, fmt.Errorf("write layer: %w", err)
			}
			continue
		}
		e := files[p]
		if e.hostPath == "" {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: e.link, Mode: 0o777, ModTime: epoch}); err != nil {
				return nil, fmt.Errorf("write layer: %w", err)
			}
			continue
		}
		data, err := os.ReadFile(e.hostPath)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", e.hostPath, err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: e.mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, fmt.Errorf("write layer: %w", err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("write layer: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	return buf.Bytes(), nil
}

func clean(p string) string { return path.Clean("/" + p) }

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string { return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:") }

func descriptor(mediaType string, b []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
}

// tagOf returns the tag of a reference, "latest" when it has none.
func tagOf(ref string) string {
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		return ref[i+1:]
	}
	return "latest"
}
