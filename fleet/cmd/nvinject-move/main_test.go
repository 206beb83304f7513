package main

import (
	"bytes"
	"context"
	"flag"
	"slices"
	"strings"
	"testing"
)

func TestFlagsFirst(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("to", "", "")
	fs.Bool("dry-run", false, "")
	for _, tc := range []struct{ in, want []string }{
		{[]string{"node-1", "--to=dra"}, []string{"--to=dra", "--", "node-1"}},
		{[]string{"node-1", "--to", "dra", "--dry-run"}, []string{"--to", "dra", "--dry-run", "--", "node-1"}},
		{[]string{"--dry-run", "node-1"}, []string{"--dry-run", "--", "node-1"}},
		{[]string{"--to=dra", "--", "-odd-node"}, []string{"--to=dra", "--", "-odd-node"}},
		{[]string{"--to=dra"}, []string{"--to=dra"}},
	} {
		if got := flagsFirst(fs, tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("flagsFirst(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Usage errors are named before any API call: no kubeconfig is needed.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"move", "n1"}, `--to=""`},
		{[]string{"move", "n1", "n2", "--to=dra"}, "give one NODE"},
		{[]string{"move", "--all", "--to=dra"}, "--all needs --selector"},
		{[]string{"upgrade", "n1"}, "--driver-version"},
		{[]string{"move", "n1", "--to=dra", "--max-unavailable=0"}, "--max-unavailable=0"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), tc.args, func(string) string { return "" }, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want a usage error naming %q", tc.args, err, tc.want)
		}
	}
}
