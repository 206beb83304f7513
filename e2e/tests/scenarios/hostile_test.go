package scenarios

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/cdi/hook/hostile"
	"github.com/nvinject/nvinject/deploy/ociimage"
)

// hostileImage is the image TestHostileImagePodLeavesHostUntouched runs.
const hostileImage = "nvinject.local/hostile:dev"

// A hostile image's GPU pod in RuntimeClass nvidia, on the real node
// (containerd, runc, the device plugin's spec with its three
// nvinject-cdi-hook createContainer hooks), leaves the host as it was. The
// image carries the attacks of issue 29 aimed at a host directory of the
// test: a CUDA compat drop-in holding ldconfig options (-r HOST -C FILE),
// an ld.so.conf listing /proc/1/root/HOST/libs (a library without its
// soname link there), /var/cache/ldconfig linking to /proc/1/root/HOST/aux
// and /etc/ld.so.cache linking to a HOST file. The pod runs, the hooks ran
// (the driver drop-in is there, the image's compat drop-in is gone), and
// every file, link, mode, time and listing under HOST is unchanged.
// cdi/hook/hostile runs these and more under runc 1.4.4 and 1.2.6 with both
// hook programs; this is the same on the whole path.
func TestHostileImagePodLeavesHostUntouched(t *testing.T) {
	d := need(t)
	ctx := testCtx(t)
	host := t.TempDir()
	libz, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/libz.so.1.*")
	if len(libz) == 0 {
		t.Skip("no host libz.so.1 to plant as the victim library")
	}
	victim, err := os.ReadFile(libz[0])
	if err != nil {
		t.Fatal(err)
	}
	for p, data := range map[string][]byte{
		"target/keep":        []byte("keep\n"),
		"libs/libpwn.so.1.0": victim,
		"aux/keep":           []byte("keep\n"),
		"victim.cache":       []byte("the host's file\n"),
	} {
		if err := os.MkdirAll(filepath.Join(host, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(host, p), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	through := func(p string) string { return "/proc/1/root" + filepath.Join(host, p) }

	img := ociimage.New(hostileImage, ociimage.WithEntrypoint("/bin/sh"))
	if err := img.AddFile("/bin/busybox", "/bin/busybox"); err != nil {
		t.Skipf("no static busybox: %v", err)
	}
	for _, a := range []string{"sh", "sleep", "cat", "ls"} {
		img.AddSymlink("/bin/"+a, "busybox")
	}
	files := t.TempDir()
	for imagePath, data := range map[string]string{
		"/etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n" + through("libs") + "\n",
		"/etc/ld.so.conf.d/00-nvinject-cuda-compat.conf": "-r " + filepath.Join(host, "target") + " -X -C /victim.cache\n",
	} {
		f := filepath.Join(files, strings.ReplaceAll(imagePath, "/", "_"))
		if err := os.WriteFile(f, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := img.AddFile(f, imagePath); err != nil {
			t.Fatal(err)
		}
	}
	img.AddSymlink("/var/cache/ldconfig", through("aux"))
	img.AddSymlink("/etc/ld.so.cache", through("victim.cache"))
	archive := filepath.Join(files, "hostile.tar")
	if err := img.WriteArchiveFile(archive); err != nil {
		t.Fatal(err)
	}
	// No registry: the image goes into every node's containerd.
	if err := d.Node().ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	for _, w := range d.Node().Workers() {
		if err := w.ImportImage(ctx, archive); err != nil {
			t.Fatal(err)
		}
	}

	before := hostTree(t, host)
	createPod(t, ctx, "hostile", podSpec{gpu: true, runtimeClass: true, image: hostileImage})
	waitPod(t, ctx, "hostile", 2*time.Minute, "Running", running)
	out, err := d.Kube().Exec(ctx, ns, "hostile", "", "/bin/sh", "-c",
		"cat /etc/ld.so.conf.d/00-nvinject-driver.conf; ls /etc/ld.so.conf.d; ls -l /etc/ld.so.cache")
	if err != nil {
		t.Fatalf("exec in the hostile pod: %v", err)
	}
	t.Logf("in the hostile pod:\n%s", out)
	if strings.Contains(out, "00-nvinject-cuda-compat.conf") || !strings.Contains(out, "00-nvinject-driver.conf") || strings.Contains(out, "->") {
		t.Errorf("the hooks did not run as they should (driver drop-in written, the image's compat drop-in removed, ld.so.cache a file):\n%s", out)
	}
	if diff := before.Changes(hostTree(t, host)); len(diff) > 0 {
		t.Errorf("the hostile pod changed the host directory %s: %s", host, strings.Join(diff, "; "))
	}
}

// hostTree is hostile.Snapshot of dir, failing t on an error.
func hostTree(t *testing.T, dir string) hostile.Tree {
	t.Helper()
	tree, err := hostile.Snapshot(dir)
	if err != nil {
		t.Fatal(err)
	}
	return tree
}
