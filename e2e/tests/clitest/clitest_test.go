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

// The shipped programs (bin/) and the equipment with the SIMULATION builds
// (_out/equipment/) follow one command-line convention.
func TestEveryBinaryFollowsTheConvention(t *testing.T) {
	for _, env := range []string{"NVINJECT_BIN", "NVINJECT_SHIPPED_BIN"} {
		bin := os.Getenv(env)
		if bin == "" {
			t.Skipf("%s is unset: `make test` sets it after `make build`", env)
		}
		entries, err := os.ReadDir(bin)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) < 9 {
			t.Fatalf("%s holds %d binaries; run `make build`", bin, len(entries))
		}
		t.Run(env, func(t *testing.T) {
			for _, e := range entries {
				if e.IsDir() {
					continue
				}
				path := filepath.Join(bin, e.Name())
				t.Run(e.Name(), func(t *testing.T) {
					t.Parallel()
					conventions(t, path, e.Name())
				})
			}
		})
	}
}

func conventions(t *testing.T, path, name string) {
	out, stderr, code := run(t, path, "--help")
	if code != 0 || !strings.HasPrefix(out, "Usage: "+name) {
		t.Errorf("--help: exit %d, stdout %.200q, stderr %.200q; want exit 0 and usage on stdout", code, out, stderr)
	}
	out, _, code = run(t, path, "--version")
	if code != 0 || !strings.HasPrefix(out, name+" ") || !strings.Contains(out, "revision ") || strings.Contains(out, "revision unknown") {
		t.Errorf("--version: exit %d, stdout %q; want exit 0 with version and revision (make build sets them)", code, out)
	}
	out, stderr, code = run(t, path, "--no-such-flag")
	if code != 2 || out != "" || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "no-such-flag") {
		t.Errorf("bad flag: exit %d, stdout %q, stderr %q; want exit 2 and one line naming the flag", code, out, stderr)
	}
}

// A shipped program has no simulation: a simulated --nvml value is refused
// at once with the way to the equipment build, while the equipment's
// SIMULATION build of the same program takes it.
func TestShippedProgramsRefuseTheSimulation(t *testing.T) {
	shipped, equipment := os.Getenv("NVINJECT_SHIPPED_BIN"), os.Getenv("NVINJECT_BIN")
	if shipped == "" || equipment == "" {
		t.Skip("NVINJECT_SHIPPED_BIN or NVINJECT_BIN is unset: `make test` sets them after `make build`")
	}
	cases := []struct {
		prog string
		args []string
	}{
		{"nvinject-cdi", []string{"generate", "--nvml=sim:a100-80gb", "--driver-root=" + t.TempDir(), "--output=" + filepath.Join(t.TempDir(), "spec.yaml")}},
		{"nvinject-cdi", []string{"simulate-driver-root", "--nvml=sim:a100-80gb", t.TempDir()}},
		{"nvinject-device-plugin", []string{"--nvml=sim:a100-80gb", "--kubelet-dir=" + t.TempDir(), "--cdi-spec-dir=" + t.TempDir()}},
		{"nvinject-dra", []string{"--nvml=sim:a100-80gb", "--node-name=n1"}},
	}
	for _, c := range cases {
		t.Run(c.prog+" "+c.args[0], func(t *testing.T) {
			_, stderr, code := run(t, filepath.Join(shipped, c.prog), c.args...)
			if code == 0 || !strings.Contains(stderr, "release build without the GPU simulation") || !strings.Contains(stderr, "make equipment") {
				t.Errorf("shipped %s %v: exit %d, stderr %.400q; want a refusal naming the release build and make equipment", c.prog, c.args, code, stderr)
			}
		})
	}
	out, stderr, code := run(t, filepath.Join(equipment, "nvinject-cdi"), "simulate-driver-root", "--nvml=sim:a100-80gb", t.TempDir())
	if code != 0 || !strings.Contains(out, "SIMULATED driver root") {
		t.Errorf("equipment nvinject-cdi simulate-driver-root: exit %d, stdout %q, stderr %.300q; want the simulated root written", code, out, stderr)
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
