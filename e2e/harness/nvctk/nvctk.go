// Package nvctk runs NVIDIA's own CDI generator, nvidia-ctk (pinned at
// github.com/NVIDIA/nvidia-container-toolkit v1.20.2, built by build.sh in this directory
// into a machine-wide cache), so parity tests can compare nvinject's spec with NVIDIA's
// for the same driver root.
//
// Without a loaded driver only `nvidia-ctk cdi generate --mode=management` works, and it
// needs device nodes: MakeDevRoot makes a dev root with mknod.
package nvctk

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/nvinject/nvinject/e2e/internal/cachebuild"
)

// Version is the nvidia-container-toolkit release build.sh builds.
const Version = "v1.20.2"

// HookPath is the nvidia-cdi-hook path GenerateManagement writes into specs unless the
// caller passes --nvidia-cdi-hook-path: nvidia-ctk's own default, fixed so the spec does
// not depend on the test machine's PATH.
const HookPath = "/usr/bin/nvidia-cdi-hook"

// UVMMajor is the major MakeDevRoot gives dev/nvidia-uvm and dev/nvidia-uvm-tools. The
// real one is dynamic (read from /proc/devices on a host with the driver); 508 is what
// nvinject's simulation uses (shared/gpu/sim.UVMMajor), so specs generated from either
// root name the same numbers.
const UVMMajor = 508

// DevNode is one character device MakeDevRoot creates.
type DevNode struct {
	Path         string // under the dev root, e.g. dev/nvidia0
	Major, Minor uint32
}

// DevNodes are the nodes of one GPU with the driver loaded: control, GPU 0, UVM.
var DevNodes = []DevNode{
	{"dev/nvidiactl", 195, 255},
	{"dev/nvidia0", 195, 0},
	{"dev/nvidia-uvm", UVMMajor, 0},
	{"dev/nvidia-uvm-tools", UVMMajor, 1},
}

//go:embed build.sh
var script []byte

// Bin builds nvidia-ctk and nvidia-cdi-hook if they are not cached and returns the
// directory holding both (a minute or so the first time, from the Go module proxy).
func Bin(ctx context.Context) (string, error) {
	bin, err := cachebuild.Run(ctx, script, "build nvidia-ctk "+Version+" (e2e/harness/nvctk/build.sh)", nil)
	if err != nil {
		return "", err
	}
	for _, p := range []string{"nvidia-ctk", "nvidia-cdi-hook"} {
		if _, err := os.Stat(filepath.Join(bin, p)); err != nil {
			return "", fmt.Errorf("e2e/harness/nvctk/build.sh printed %q: %w", bin, err)
		}
	}
	return bin, nil
}

// GenerateManagement runs `nvidia-ctk cdi generate --mode=management` for the driver
// root and dev root (a directory holding dev/nvidia*, see MakeDevRoot) and returns the
// spec it prints: YAML unless args holds --format=json. args are appended to the
// command line (later flags win), e.g. "--format=json", "--vendor=example.com"; an
// --output would leave nothing to return.
func GenerateManagement(ctx context.Context, root, devRoot string, args ...string) ([]byte, error) {
	bin, err := Bin(ctx)
	if err != nil {
		return nil, err
	}
	argv := append([]string{"cdi", "generate", "--mode=management",
		"--driver-root=" + root, "--dev-root=" + devRoot,
		"--nvidia-cdi-hook-path=" + HookPath}, args...)
	var spec, log bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "nvidia-ctk"), argv...)
	cmd.Env = cleanEnv()
	// The spec goes to stdout, the generator's log to stderr.
	cmd.Stdout, cmd.Stderr = &spec, &log
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("nvidia-ctk %s: %w: %s", strings.Join(argv, " "), err, cachebuild.Tail(log.String(), 10))
	}
	if spec.Len() == 0 {
		return nil, fmt.Errorf("nvidia-ctk %s printed no spec: %s", strings.Join(argv, " "), cachebuild.Tail(log.String(), 10))
	}
	return spec.Bytes(), nil
}

// cleanEnv drops NVIDIA_CTK_* and NVIDIA_* settings of the calling environment, which
// nvidia-ctk reads as flag defaults, so the spec depends only on the arguments.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "NVIDIA_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// MakeDevRoot creates dir/dev with DevNodes as character devices (mknod: needs root or
// CAP_MKNOD). Existing nodes with the right numbers are kept.
func MakeDevRoot(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "dev"), 0o755); err != nil {
		return err
	}
	for _, n := range DevNodes {
		p := filepath.Join(dir, n.Path)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err == nil {
			if st.Mode&syscall.S_IFMT == syscall.S_IFCHR && st.Rdev == mkdev(n.Major, n.Minor) {
				continue
			}
			return fmt.Errorf("%s exists and is not char device %d:%d", p, n.Major, n.Minor)
		}
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(mkdev(n.Major, n.Minor))); err != nil {
			if errors.Is(err, syscall.EPERM) {
				return fmt.Errorf("mknod %s: %w (needs root or CAP_MKNOD)", p, err)
			}
			return fmt.Errorf("mknod %s: %w", p, err)
		}
	}
	return nil
}

// mkdev encodes a device number as glibc's makedev does.
func mkdev(major, minor uint32) uint64 {
	ma, mi := uint64(major), uint64(minor)
	return mi&0xff | (ma&0xfff)<<8 | (mi&^0xff)<<12 | (ma&^0xfff)<<32
}
