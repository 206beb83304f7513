package kubelocal

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/nvinject/nvinject/deploy/ociimage"
)

// ImportImage imports an OCI image archive into the CRI namespace of the node's containerd.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	out, err := exec.CommandContext(ctx, n.tool("ctr"), "--address", n.layout.containerdSocket(),
		"-n", "k8s.io", "images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("import %s into containerd (log: %s): %w: %s", archive, n.layout.logFile("containerd"), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// importSandboxImage packs the pause program as SandboxImage and imports it, because
// there is no registry to pull the sandbox image from.
func (n *Node) importSandboxImage(ctx context.Context) error {
	if err := os.MkdirAll(n.layout.images(), 0o755); err != nil {
		return fmt.Errorf("create image dir: %w", err)
	}
	pause := n.pauseBinary
	if pause == "" {
		pause = filepath.Join(n.layout.images(), "pause")
		if err := BuildPause(ctx, pause); err != nil {
			return err
		}
	}
	img := ociimage.New(SandboxImage, ociimage.WithEntrypoint("/pause"))
	if err := img.AddFile(pause, "/pause"); err != nil {
		return err
	}
	archive := filepath.Join(n.layout.images(), "pause.tar")
	if err := img.WriteArchiveFile(archive); err != nil {
		return err
	}
	return n.ImportImage(ctx, archive)
}

// BuildPause builds e2e/cmd/pause as a static binary at out. It needs the Go toolchain
// and this source tree; elsewhere pass a prebuilt binary with WithPauseBinary.
func BuildPause(ctx context.Context, out string) error {
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return fmt.Errorf("locate the e2e module to build pause: pass a prebuilt pause binary")
	}
	moduleDir := filepath.Dir(filepath.Dir(filepath.Dir(self))) // e2e/harness/kubelocal
	if _, err := os.Stat(filepath.Join(moduleDir, "cmd", "pause")); err != nil {
		return fmt.Errorf("e2e/cmd/pause not found next to %s: pass a prebuilt pause binary: %w", self, err)
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", abs, "./cmd/pause")
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build pause: %w: %s", err, output)
	}
	return nil
}
