package bookworm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/deploy/ociimage"
)

func rootfs(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mmdebstrap and chroot need root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tarball, err := Rootfs(ctx)
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("no bookworm rootfs: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tarball
}

func TestRootfs(t *testing.T) {
	tarball := rootfs(t)
	out, err := exec.Command("tar", "-tf", tarball).Output()
	if err != nil {
		t.Fatal(err)
	}
	names := "\n" + string(out)
	for _, want := range []string{"./usr/sbin/ldconfig", "./usr/lib/x86_64-linux-gnu/libc.so.6", "./usr/bin/bash", "./etc/ld.so.conf.d/x86_64-linux-gnu.conf"} {
		if !strings.Contains(names, "\n"+want+"\n") {
			t.Errorf("rootfs lacks %s", want)
		}
	}
	// It is a base layer as it is.
	img := ociimage.New("example.com/bookworm:test", ociimage.WithBaseLayer(tarball), ociimage.WithEntrypoint("/usr/bin/bash"))
	img.AddSymlink("/usr/local/bin/sh-alias", "/usr/bin/bash")
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := img.WriteArchiveFile(archive); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(archive)
	b, _ := os.Stat(tarball)
	if a.Size() <= b.Size() {
		t.Errorf("image archive %d bytes, rootfs %d", a.Size(), b.Size())
	}
}

func TestUnpack(t *testing.T) {
	tarball := rootfs(t)
	tree := t.TempDir()
	// A driver-root-like tree: its lib/ must land in usr/lib through the base's link,
	// and its own ld.so files must not replace the base's.
	for p, data := range map[string]string{"lib/firmware/nvidia/test.bin": "fw", "etc/ld.so.conf": "/nowhere\n"} {
		if err := os.MkdirAll(filepath.Join(tree, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tree, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "root")
	if err := Unpack(context.Background(), tarball, dir, tree); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "lib")); err != nil || target != "usr/lib" {
		t.Errorf("lib -> %q, %v; want the base's usr/lib link kept", target, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "usr/lib/firmware/nvidia/test.bin")); err != nil {
		t.Error(err)
	}
	if conf, _ := os.ReadFile(filepath.Join(dir, "etc/ld.so.conf")); strings.Contains(string(conf), "/nowhere") {
		t.Error("the tree's etc/ld.so.conf replaced the base's")
	}
	out, err := exec.Command("chroot", dir, "/usr/sbin/ldconfig", "-p").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "libc.so.6 ") {
		t.Errorf("ldconfig -p in the chroot: %v\n%s", err, out)
	}
}
