// Package clitest holds the CLI-convention test: every binary in bin/
// answers --help on stdout with exit 0, --version with its version and VCS
// revision and exit 0, and a bad flag with one line on stderr and exit 2.
package clitest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEveryBinaryFollowsTheConvention(t *testing.T) {
	bin := os.Getenv("NVINJECT_BIN")
	if bin == "" {
		t.Skip("NVINJECT_BIN is unset: `make test` sets it to bin/ after `make build`")
	}
	entries, err := os.ReadDir(bin)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 10 {
		t.Fatalf("%s holds %d binaries; run `make build`", bin, len(entries))
	}
	for _, e := range entries {
		path := filepath.Join(bin, e.Name())
		t.Run(e.Name(), func(t *testing.T) {
			t.Parallel()
			out, stderr, code := run(t, path, "--help")
			if code != 0 || !strings.HasPrefix(out, "Usage: "+e.Name()) {
				t.Errorf("--help: exit %d, stdout %.200q, stderr %.200q; want exit 0 and usage on stdout", code, out, stderr)
			}
			out, _, code = run(t, path, "--version")
			if code != 0 || !strings.HasPrefix(out, e.Name()+" ") || !strings.Contains(out, "revision ") || strings.Contains(out, "revision unknown") {
				t.Errorf("--version: exit %d, stdout %q; want exit 0 with version and revision (make build sets them)", code, out)
			}
			out, stderr, code = run(t, path, "--no-such-flag")
			if code != 2 || out != "" || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "no-such-flag") {
				t.Errorf("bad flag: exit %d, stdout %q, stderr %q; want exit 2 and one line naming the flag", code, out, stderr)
			}
		})
	}
}

func run(t *testing.T, path string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var o, e bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("%s %v: %v", path, args, err)
	}
	return o.String(), e.String(), code
}
