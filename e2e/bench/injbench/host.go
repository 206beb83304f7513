package injbench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/deploy/ociimage"
)

// Images the benchmark imports; there is no registry to pull from.
const (
	sandboxImage  = "nvinject.local/injbench/pause:1"
	workloadImage = "nvinject.local/injbench/workload:1"
)

// simNode is the SIMULATED GPU node the CDI spec and nvinject-nri describe.
const simNode = "sim:a100-80gb"

// run runs a short-lived program and returns its error with its output.
func run(ctx context.Context, path string, args ...string) error {
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(path), strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// writeCDISpec writes the simulated driver root and its CDI spec, and
// returns the qualified CDI name of the GPU (by UUID) and its UUID.
func writeCDISpec(ctx context.Context, nvinjectCDI string, l layout) (name, uuid string, err error) {
	if err := run(ctx, nvinjectCDI, "simulate-driver-root", "--nvml="+simNode, l.driverRoot()); err != nil {
		return "", "", fmt.Errorf("write the simulated driver root (is nvidia-smi-sim next to nvinject-cdi?): %w", err)
	}
	if err := run(ctx, nvinjectCDI, "generate", "--nvml="+simNode, "--driver-root="+l.driverRoot(), "--cdi-spec-dir="+l.cdiDir()); err != nil {
		return "", "", fmt.Errorf("generate the CDI spec: %w", err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(l.cdiDir()), cdi.WithAutoRefresh(false))
	if err != nil {
		return "", "", fmt.Errorf("read the generated CDI spec in %s: %w", l.cdiDir(), err)
	}
	for _, n := range cache.ListDevices() {
		if _, id, ok := strings.Cut(n, "=GPU-"); ok {
			return n, "GPU-" + id, nil
		}
	}
	return "", "", fmt.Errorf("no GPU-<uuid> device in the CDI spec under %s (errors: %v): check nvinject-cdi generate", l.cdiDir(), cache.GetErrors())
}

// writeImages packs the sandbox image (pause) and the workload image
// (pause as PID 1, so stopping is prompt, plus busybox for the in-container
// check) and returns their archives.
func writeImages(l layout, pause, busybox string) ([]string, error) {
	if err := os.MkdirAll(l.images(), 0o755); err != nil {
		return nil, fmt.Errorf("create image dir: %w", err)
	}
	sandbox := ociimage.New(sandboxImage, ociimage.WithEntrypoint("/pause"))
	workload := ociimage.New(workloadImage, ociimage.WithEntrypoint("/pause"))
	err := errors.Join(sandbox.AddFile(pause, "/pause"), workload.AddFile(pause, "/pause"), workload.AddBinary(busybox, "/bin/busybox"))
	if err != nil {
		return nil, fmt.Errorf("pack images (install busybox-static, build e2e/cmd/pause): %w", err)
	}
	workload.AddSymlink("/bin/sh", "busybox")
	var archives []string
	for name, img := range map[string]*ociimage.Image{"pause.tar": sandbox, "workload.tar": workload} {
		a := filepath.Join(l.images(), name)
		if err := img.WriteArchiveFile(a); err != nil {
			return nil, err
		}
		archives = append(archives, a)
	}
	return archives, nil
}

// importImages imports the archives into containerd's CRI namespace.
func importImages(ctx context.Context, ctr, socket string, archives []string) error {
	for _, a := range archives {
		if err := run(ctx, ctr, "--address", socket, "-n", "k8s.io", "images", "import", a); err != nil {
			return fmt.Errorf("import %s into containerd: %w", a, err)
		}
	}
	return nil
}
