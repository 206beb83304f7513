package ociimage

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// baseLayer is a root filesystem tar used as the image's first layer: its digest and
// the directories and symlinks it holds, which the added files' paths resolve against.
type baseLayer struct {
	path   string
	digest string
	size   int64
	dirs   map[string]bool   // absolute paths
	links  map[string]string // absolute path -> link target
	nondir map[string]bool   // files and other non-directories
}

// readBase reads the tar once: its sha256 (the layer's digest and diff ID, the tar being
// uncompressed) and its index.
func readBase(p string) (*baseLayer, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n := &countingReader{r: io.TeeReader(f, h)}
	b := &baseLayer{path: p, dirs: map[string]bool{"/": true}, links: map[string]string{}, nondir: map[string]bool{}}
	tr := tar.NewReader(n)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("base layer %s: %w", p, err)
		}
		name := clean(strings.TrimPrefix(hdr.Name, "./"))
		switch hdr.Typeflag {
		case tar.TypeDir:
			b.dirs[name] = true
		case tar.TypeSymlink:
			b.links[name] = hdr.Linkname
		default:
			b.nondir[name] = true
		}
	}
	// The tar reader stops at the end-of-archive marker; hash the padding after it too.
	if _, err := io.Copy(io.Discard, n); err != nil {
		return nil, fmt.Errorf("base layer %s: %w", p, err)
	}
	b.digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	b.size = n.n
	return b, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// resolveParent rewrites p so that none of its parent directories is a symlink of the
// base: /lib/x86_64-linux-gnu/libfoo.so with lib -> usr/lib becomes
// /usr/lib/x86_64-linux-gnu/libfoo.so. The last component is kept as it is.
func (b *baseLayer) resolveParent(p string) (string, error) {
	dir, file := path.Split(clean(p))
	parts := strings.Split(strings.Trim(dir, "/"), "/")
	cur := "/"
	for hops := 0; len(parts) > 0; {
		if parts[0] == "" {
			parts = parts[1:]
			continue
		}
		next := path.Join(cur, parts[0])
		parts = parts[1:]
		target, ok := b.links[next]
		if !ok {
			if b.nondir[next] {
				return "", fmt.Errorf("image path %s: %s is a file in the base layer", p, next)
			}
			cur = next
			continue
		}
		if hops++; hops > 32 {
			return "", fmt.Errorf("image path %s: too many symlinks in the base layer", p)
		}
		if !path.IsAbs(target) {
			target = path.Join(cur, target)
		}
		// Resolve the target's own components again, then the rest.
		parts = append(strings.Split(strings.Trim(path.Clean(target), "/"), "/"), parts...)
		cur = "/"
	}
	return path.Join(cur, file), nil
}

// writeBlob copies the tar into the archive as its blob.
func (b *baseLayer) writeBlob(tw *tar.Writer) error {
	f, err := os.Open(b.path)
	if err != nil {
		return fmt.Errorf("base layer: %w", err)
	}
	defer f.Close()
	name := "blobs/sha256/" + strings.TrimPrefix(b.digest, "sha256:")
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: b.size, ModTime: epoch}); err != nil {
		return fmt.Errorf("write archive: %w", err)
	}
	if n, err := io.Copy(tw, f); err != nil || n != b.size {
		return fmt.Errorf("write base layer blob: %d of %d bytes: %v (did %s change?)", n, b.size, err, b.path)
	}
	return nil
}
