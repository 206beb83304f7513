package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img := New("example.com/test:v1", WithEntrypoint("/bin/tool"))
	if err := img.AddFile(bin, "/bin/tool"); err != nil {
		t.Fatal(err)
	}
	img.AddSymlink("/bin/sh", "tool")
	var buf bytes.Buffer
	if err := img.WriteArchive(&buf); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		files[h.Name] = data
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != "example.com/test:v1" {
		t.Fatalf("index = %+v", index)
	}
	if _, ok := files["blobs/sha256/"+index.Manifests[0].Digest[len("sha256:"):]]; !ok {
		t.Fatal("manifest blob missing")
	}
	layer, err := img.layer(nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	lr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		names = append(names, h.Name)
	}
	want := []string{"bin/", "bin/sh", "bin/tool"}
	if len(names) != len(want) || names[0] != want[0] || names[1] != want[1] || names[2] != want[2] {
		t.Errorf("layer entries = %v, want %v", names, want)
	}
}

func TestAddBinaryAddsLibraries(t *testing.T) {
	img := New("example.com/ls:v1")
	if err := img.AddBinary("/bin/ls", "/bin/ls"); err != nil {
		t.Fatal(err)
	}
	found := false
	for p := range img.files {
		if filepath.Base(p) == "libc.so.6" {
			found = true
		}
	}
	if !found {
		t.Errorf("libc.so.6 not added; files: %v", img.files)
	}
}

func TestUserLabelsAndFileList(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img := New("example.com/prog:v1", WithUser("65532:65532"), WithLabels(map[string]string{"org.opencontainers.image.version": "1.2.3"}))
	if err := img.AddFile(bin, "/usr/bin/prog"); err != nil {
		t.Fatal(err)
	}
	img.AddSymlink("/usr/bin/p", "prog")
	if got := img.FileList(); len(got) != 2 || got[0] != "l 0777 /usr/bin/p -> prog" || got[1] != "f 0755 /usr/bin/prog" {
		t.Errorf("FileList = %q", got)
	}
	var b bytes.Buffer
	if err := img.WriteArchive(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b.Bytes(), []byte(`"User":"65532:65532"`)) || !bytes.Contains(b.Bytes(), []byte(`"org.opencontainers.image.version":"1.2.3"`)) {
		t.Error("the image config lacks the user or the label")
	}
}
