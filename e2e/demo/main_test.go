package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nvinject/nvinject/shared/cli"
)

func TestModeFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		mode mode
		code int
		err  []string // on stderr, in one line
	}{
		{args: nil, mode: "device-plugin"},
		{args: []string{"-mode", "dra"}, mode: "dra"},
		{args: []string{"--mode=device-plugin"}, env: map[string]string{"MODE": "dra"}, mode: "device-plugin"},
		{env: map[string]string{"MODE": "dra"}, mode: "dra"},
		{args: []string{"-mode", "DRA"}, code: cli.ExitUsage, err: []string{"-mode", `"DRA"`, "use device-plugin or dra"}},
		{env: map[string]string{"MODE": "nri"}, code: cli.ExitUsage, err: []string{"MODE=", "--mode", "use device-plugin or dra"}},
		{args: []string{"dra"}, code: cli.ExitUsage, err: []string{`"dra"`, "flags only"}},
		{args: []string{"-mig", "single"}, mode: "device-plugin"},
		{env: map[string]string{"MIG": "half"}, code: cli.ExitUsage, err: []string{"half", "use none, single or mixed"}},
		{args: []string{"-mig", "mixed", "-mode", "dra"}, code: cli.ExitUsage, err: []string{"MODE=device-plugin"}},
	} {
		var stdout, stderr bytes.Buffer
		c, err := parse(tc.args, func(k string) string { return tc.env[k] }, &stdout, &stderr)
		code := cli.Code("demo", err, &stderr)
		if code != tc.code || (code == 0 && c.mode != tc.mode) {
			t.Errorf("%v %v: exit %d mode %q (stderr %q), want exit %d mode %q", tc.args, tc.env, code, c.mode, stderr.String(), tc.code, tc.mode)
		}
		msg := strings.TrimSpace(stderr.String())
		for _, w := range tc.err {
			if !strings.Contains(msg, w) || strings.Contains(msg, "\n") {
				t.Errorf("%v %v: stderr %q, want one line containing %q", tc.args, tc.env, msg, w)
			}
		}
	}
}
