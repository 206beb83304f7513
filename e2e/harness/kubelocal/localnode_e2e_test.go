package kubelocal_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nvinject/nvinject/deploy/ociimage"
	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/e2e/internal/hostclean"
)

const (
	busyboxImage = "docker.io/library/busybox:nvinject-e2e"
	glibcImage   = "localhost/nvinject-e2e/ls:v1"
	marker       = "nvinject-e2e-ok"
)

// TestLocalNode brings up the real node, runs a busybox pod through the API server to
// completion, checks its log, and proves teardown leaves nothing behind.
func TestLocalNode(t *testing.T) {
	bin := os.Getenv("NVINJECT_TOOLS_BIN")
	if bin == "" {
		t.Skip("NVINJECT_TOOLS_BIN is unset: run `make tools` (or `make e2e`, which sets it) to build the node's binaries")
	}
	if os.Geteuid() != 0 {
		t.Skip("the local node needs root (mounts, cgroups, runc)")
	}
	runDir := os.Getenv("NVINJECT_E2E_RUN_DIR")
	if runDir == "" {
		runDir = "/tmp/nvinject-e2e"
	}
	opts := []kubelocal.Option{kubelocal.WithRunDir(runDir), kubelocal.WithToolsBin(bin), kubelocal.WithTimeout(2 * time.Minute)}
	if dropIn, err := filepath.Abs("../../../deploy/containerd/nvinject.toml"); err == nil {
		if _, err := os.Stat(dropIn); err == nil {
			opts = append(opts, kubelocal.WithContainerdDropIn(dropIn))
		}
	}
	node := kubelocal.New(opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	downDone := false
	t.Cleanup(func() {
		if !downDone {
			if err := node.Down(context.Background()); err != nil {
				t.Errorf("down: %v", err)
			}
		}
	})
	start := time.Now()
	if err := node.Up(ctx); err != nil {
		t.Fatalf("up: %v", err)
	}
	t.Logf("node up and Ready in %s", time.Since(start).Round(time.Millisecond))

	archive := filepath.Join(t.TempDir(), "busybox.tar")
	img := ociimage.New(busyboxImage, ociimage.WithEntrypoint("/bin/sh"))
	if err := img.AddFile("/bin/busybox", "/bin/busybox"); err != nil {
		t.Fatalf("busybox image (apt-get install busybox-static): %v", err)
	}
	img.AddSymlink("/bin/sh", "busybox")
	if err := img.WriteArchiveFile(archive); err != nil {
		t.Fatal(err)
	}
	if err := node.ImportImage(ctx, archive); err != nil {
		t.Fatal(err)
	}
	// A dynamically linked program proves AddBinary packs what ldd reports.
	glibc := ociimage.New(glibcImage)
	if err := glibc.AddBinary("/bin/ls", "/bin/ls"); err != nil {
		t.Fatal(err)
	}
	glibcArchive := filepath.Join(t.TempDir(), "glibc.tar")
	if err := glibc.WriteArchiveFile(glibcArchive); err != nil {
		t.Fatal(err)
	}
	if err := node.ImportImage(ctx, glibcArchive); err != nil {
		t.Fatal(err)
	}

	run := func(stdin string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", node.Kubeconfig()}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	kubectl := func(stdin string, args ...string) string {
		t.Helper()
		out, err := run(stdin, args...)
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s\nkubelet log: %s", strings.Join(args, " "), err, out, node.LogFile("kubelet"))
		}
		return out
	}
	podStart := time.Now()
	// Up returns once the default ServiceAccount exists, so admission takes the pod at once.
	kubectl(podManifest, "apply", "-f", "-")
	kubectl("", "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/busybox", "--timeout=120s")
	t.Logf("pod Succeeded %s after creation", time.Since(podStart).Round(time.Millisecond))
	// The nvidia RuntimeClass handler (from the deploy drop-in, or the harness fallback)
	// must run pods too.
	kubectl(nvidiaManifest, "apply", "-f", "-")
	kubectl("", "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/busybox-nvidia", "--timeout=120s")
	if logs := kubectl("", "logs", "pod/busybox-nvidia"); !strings.Contains(logs, marker) {
		t.Errorf("nvidia-handler pod log = %q, want %q", logs, marker)
	}
	if logs := kubectl("", "logs", "pod/busybox"); !strings.Contains(logs, marker+" Linux") {
		t.Errorf("pod log = %q, want %q", logs, marker+" Linux")
	}
	if logs := kubectl("", "logs", "pod/busybox", "-c", "glibc"); !strings.Contains(logs, "ls") {
		t.Errorf("glibc container log = %q, want a listing of /bin with ls", logs)
	}

	downStart := time.Now()
	downDone = true
	if err := node.Down(context.Background()); err != nil {
		t.Fatalf("down: %v", err)
	}
	t.Logf("node down in %s", time.Since(downStart).Round(time.Millisecond))
	if pids := hostclean.Processes(runDir); len(pids) > 0 {
		t.Errorf("processes still reference %s after down: %v", runDir, pids)
	}
	if mounts, err := hostclean.MountsUnder(runDir); err != nil || len(mounts) > 0 {
		t.Errorf("mounts remain under %s: %v %v", runDir, mounts, err)
	}
	if left := hostclean.CgroupsLeft("kubepods"); len(left) > 0 {
		t.Errorf("cgroups remain: %v", left)
	}
	if _, err := os.Stat("/sys/class/net/nvinject0"); err == nil {
		t.Error("CNI bridge nvinject0 remains")
	}
}

const podManifest = `apiVersion: v1
kind: Pod
metadata:
  name: busybox
  namespace: default
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: busybox
    image: ` + busyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/busybox", "sh", "-c", "echo ` + marker + ` $(/bin/busybox uname -s)"]
  - name: glibc
    image: ` + glibcImage + `
    imagePullPolicy: Never
    command: ["/bin/ls", "/bin"]
`

const nvidiaManifest = `apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: nvidia
handler: nvidia
---
apiVersion: v1
kind: Pod
metadata:
  name: busybox-nvidia
  namespace: default
spec:
  runtimeClassName: nvidia
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: busybox
    image: ` + busyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/busybox", "echo", "` + marker + `"]
`
