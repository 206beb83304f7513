package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// writeTar writes a tar of hdrs (regular files get body "x").
func writeTar(t *testing.T, p string, hdrs ...tar.Header) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("x"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readArchive returns the archive's files by name.
func readArchive(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name], _ = io.ReadAll(tr)
	}
}

func layerNames(t *testing.T, layer []byte) map[string]*tar.Header {
	t.Helper()
	out := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = h
	}
}

// A merged-/usr base: the added library's /lib parent goes through the base's
// lib -> usr/lib link and the directories the base has are not repeated.
func TestWithBaseLayer(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.tar")
	writeTar(t, base,
		tar.Header{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeDir, Name: "./usr/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeDir, Name: "./usr/lib/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeDir, Name: "./usr/lib/x86_64-linux-gnu/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeSymlink, Name: "./lib", Linkname: "usr/lib"},
		tar.Header{Typeflag: tar.TypeDir, Name: "./etc/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeReg, Name: "./etc/os-release", Mode: 0o644},
	)
	lib := filepath.Join(dir, "libfoo.so.1")
	if err := os.WriteFile(lib, []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := New("example.com/base:v1", WithBaseLayer(base), WithEntrypoint("/usr/bin/foo"))
	if err := img.AddFile(lib, "/lib/x86_64-linux-gnu/nvidia/libfoo.so.1"); err != nil {
		t.Fatal(err)
	}
	img.AddSymlink("/usr/bin/foo", "bar")
	var buf bytes.Buffer
	if err := img.WriteArchive(&buf); err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, &buf)
	var index struct{ Manifests []struct{ Digest string } }
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct {
			Digest string
			Size   int64
		}
	}
	if err := json.Unmarshal(files["blobs/sha256/"+index.Manifests[0].Digest[7:]], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) != 2 {
		t.Fatalf("layers = %+v, want base + files", manifest.Layers)
	}
	baseData, _ := os.ReadFile(base)
	sum := sha256.Sum256(baseData)
	if want := "sha256:" + hex.EncodeToString(sum[:]); manifest.Layers[0].Digest != want || manifest.Layers[0].Size != int64(len(baseData)) {
		t.Errorf("base layer %+v, want digest %s size %d", manifest.Layers[0], want, len(baseData))
	}
	if !bytes.Equal(files["blobs/sha256/"+manifest.Layers[0].Digest[7:]], baseData) {
		t.Error("base blob differs from the tar")
	}
	var config struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(files["blobs/sha256/"+manifest.Config.Digest[7:]], &config); err != nil {
		t.Fatal(err)
	}
	if len(config.RootFS.DiffIDs) != 2 || config.RootFS.DiffIDs[0] != manifest.Layers[0].Digest || config.RootFS.DiffIDs[1] != manifest.Layers[1].Digest {
		t.Errorf("diff_ids %v, layers %+v", config.RootFS.DiffIDs, manifest.Layers)
	}
	entries := layerNames(t, files["blobs/sha256/"+manifest.Layers[1].Digest[7:]])
	var names []string
	for n := range entries {
		names = append(names, n)
	}
	slices.Sort(names)
	want := []string{"usr/bin/", "usr/bin/foo", "usr/lib/x86_64-linux-gnu/nvidia/", "usr/lib/x86_64-linux-gnu/nvidia/libfoo.so.1"}
	if !slices.Equal(names, want) {
		t.Errorf("files layer = %v, want %v", names, want)
	}
}

func TestWithBaseLayerRejectsFileAsDir(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.tar")
	writeTar(t, base, tar.Header{Typeflag: tar.TypeReg, Name: "./opt", Mode: 0o644})
	img := New("example.com/bad:v1", WithBaseLayer(base))
	img.AddSymlink("/opt/tool", "x")
	if err := img.WriteArchive(io.Discard); err == nil {
		t.Fatal("adding /opt/tool over the base's file /opt succeeded")
	}
}

func TestAddTree(t *testing.T) {
	src := t.TempDir()
	mustMkdir := func(p string, mode os.FileMode) {
		if err := os.MkdirAll(filepath.Join(src, p), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(src, p), mode)
	}
	mustMkdir("usr/lib/x86_64-linux-gnu", 0o755)
	mustMkdir("var/log/private", 0o700)
	if err := os.WriteFile(filepath.Join(src, "usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03"), []byte("elf"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libcuda.so.535.261.03", filepath.Join(src, "usr/lib/x86_64-linux-gnu/libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	img := New("example.com/tree:v1")
	if err := img.AddTree(src, "/"); err != nil {
		t.Fatal(err)
	}
	layer, err := img.layer(nil)
	if err != nil {
		t.Fatal(err)
	}
	entries := layerNames(t, layer)
	if h := entries["usr/lib/x86_64-linux-gnu/libcuda.so.1"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "libcuda.so.535.261.03" {
		t.Errorf("libcuda.so.1 = %+v, want the relative link", h)
	}
	if h := entries["usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03"]; h == nil || h.Typeflag != tar.TypeReg || h.Mode != 0o644 {
		t.Errorf("libcuda.so.535.261.03 = %+v", h)
	}
	if h := entries["var/log/private/"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o700 {
		t.Errorf("empty dir var/log/private = %+v, want mode 0700 kept", h)
	}
	fifo := filepath.Join(src, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err == nil {
		if err := New("x").AddTree(src, "/"); err == nil {
			t.Error("AddTree accepted a FIFO")
		}
	}
}
