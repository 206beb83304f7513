package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// shell prints each piece of evidence after the exact command that produced it.
type shell struct {
	out io.Writer
}

// section starts a titled block.
func (s shell) section(title string) {
	fmt.Fprintf(s.out, "\n== %s ==\n", title)
}

// run prints argv as a shell line, runs it and prints its combined output.
func (s shell) run(ctx context.Context, argv ...string) (string, error) {
	fmt.Fprintf(s.out, "$ %s\n", quoteArgs(argv))
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	fmt.Fprint(s.out, indent(string(out)))
	if err != nil {
		return string(out), fmt.Errorf("%s: %w", argv[0], err)
	}
	return string(out), nil
}

// note prints a line of commentary.
func (s shell) note(format string, args ...any) {
	fmt.Fprintf(s.out, "  -> "+format+"\n", args...)
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}

func quoteArgs(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = quote(a)
	}
	return strings.Join(q, " ")
}

func quote(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,@%+") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}
