package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/cli"
)

func TestCommandLine(t *testing.T) {
	bundle := t.TempDir()
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"root":{"path":"rootfs"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	state := `{"ociVersion":"1.2.0","id":"c","status":"creating","bundle":"` + bundle + `"}`
	for _, tc := range []struct {
		args  []string
		stdin string
		code  int
		out   string
	}{
		{nil, "", cli.ExitUsage, ""},
		{[]string{"--help"}, "", cli.ExitOK, "create-symlinks --link"},
		{[]string{"--version"}, "", cli.ExitOK, "nvinject-cdi-hook dev"},
		{[]string{"bogus"}, "", cli.ExitUsage, ""},
		{[]string{"chmod"}, "", cli.ExitUsage, ""},
		{[]string{"create-symlinks", "--bogus"}, state, cli.ExitUsage, ""},
		{[]string{"create-symlinks", "--link", "relative::link"}, state, cli.ExitUsage, ""},
		{[]string{"create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"}, "not json", cli.ExitFailure, ""},
		{[]string{"create-symlinks", "--link", "libcuda.so.1::/usr/lib/libcuda.so"}, state, cli.ExitOK, ""},
		{[]string{"enable-cuda-compat", "--host-driver-version=535.261.03"}, state, cli.ExitOK, ""},
		{[]string{"update-ldcache", "--help"}, "", cli.ExitOK, "--folder"},
	} {
		var out, errw bytes.Buffer
		err := run(tc.args, strings.NewReader(tc.stdin), &out, &errw)
		if code := cli.Code(name, err, &errw); code != tc.code || !strings.Contains(out.String(), tc.out) {
			t.Errorf("%v: exit %d (%v), stdout %q; want exit %d and %q", tc.args, code, err, out.String(), tc.code, tc.out)
		}
		var ue cli.UsageError
		if tc.code == cli.ExitUsage && (!errors.As(err, &ue) || strings.Contains(err.Error(), "\n")) {
			t.Errorf("%v: usage error %v is not one line", tc.args, err)
		}
	}
	if got, err := os.Readlink(filepath.Join(bundle, "rootfs/usr/lib/libcuda.so")); err != nil || got != "libcuda.so.1" {
		t.Errorf("create-symlinks made %q, %v", got, err)
	}
}
