// Package cachebuild runs the embedded build scripts that fill nvinject's
// machine-wide cache (the real driver root, the bookworm rootfs,
// nvidia-ctk): each prints its result's path alone on the last stdout line
// and exits 3 when Debian's archive or the module proxy cannot be reached.
package cachebuild

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ExitUnavailable is the scripts' exit status for an unreachable archive.
const ExitUnavailable = 3

// ErrUnavailable is wrapped by Run's error when the script exits 3.
var ErrUnavailable = errors.New("the package archive cannot be reached and nothing is cached")

// debianMirrors is the shell library the scripts source from
// ../../internal/cachebuild/ (they live in e2e/harness/<name>/).
//
//go:embed debian-mirrors.sh
var debianMirrors []byte

// Run writes script (embedded, so it runs from any directory; its cache key
// hashes its content) to a temporary file, with the library it sources
// where it looks for it, runs it with bash and args, and returns the last
// stdout line. Progress (stderr) is copied to log (nil: dropped); an error
// quotes its last lines and names what (e.g. "e2e/harness/driverroot/build.sh").
func Run(ctx context.Context, script []byte, what string, log io.Writer, args ...string) (string, error) {
	dir, err := os.MkdirTemp("", "nvinject-cachebuild-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	// As in e2e/: harness/<name>/build.sh and internal/cachebuild/debian-mirrors.sh.
	path := filepath.Join(dir, "harness", "script", "build.sh")
	lib := filepath.Join(dir, "internal", "cachebuild", "debian-mirrors.sh")
	for _, d := range []string{filepath.Dir(path), filepath.Dir(lib)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(lib, debianMirrors, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, script, 0o755); err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", append([]string{path}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if log != nil {
		cmd.Stderr = io.MultiWriter(&stderr, log)
	}
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.ExitCode() == ExitUnavailable:
		return "", fmt.Errorf("%s: %w: %s", what, ErrUnavailable, Tail(stderr.String(), 3))
	case err != nil:
		return "", fmt.Errorf("%s: %w: %s", what, err, Tail(stderr.String(), 8))
	}
	return Tail(stdout.String(), 1), nil
}

// Tail returns the last n non-empty lines of s, joined by " | ".
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.TrimSpace(strings.Join(lines, " | "))
}
