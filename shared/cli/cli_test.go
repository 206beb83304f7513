package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func newCmd(out, errw *bytes.Buffer) (*Command, *string, *time.Duration, *StringList) {
	c := New("prog", "[flags]", WithOutput(out, errw), WithEnvPrefix("NVINJECT_"))
	s := c.Flags().String("cdi-spec-dir", "/var/run/cdi", "where specs are")
	d := c.Flags().Duration("quiet-period", 5*time.Minute, "quiet period")
	l := NewStringList("nvidia")
	c.Flags().Var(l, "runtime-handler", "handlers")
	c.Deprecated("spec-dir", "cdi-spec-dir")
	c.Env("cdi-spec-dir", "PLUGIN_DIR")
	return c, s, d, l
}

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--help"}, ExitOK, "Usage: prog [flags]"},
		{[]string{"-h"}, ExitOK, "--cdi-spec-dir"},
		{[]string{"--version"}, ExitOK, "prog dev (revision"},
		{[]string{"--bogus"}, ExitUsage, ""},
		{[]string{"--quiet-period=5"}, ExitUsage, ""},
		{[]string{"--quiet-period=5s"}, ExitOK, ""},
	} {
		var out, errw bytes.Buffer
		c, _, _, _ := newCmd(&out, &errw)
		code := Code("prog", c.Parse(tc.args, nil), &errw)
		if code != tc.code || !strings.Contains(out.String(), tc.out) {
			t.Errorf("%v: code %d stdout %q stderr %q; want code %d and %q", tc.args, code, out.String(), errw.String(), tc.code, tc.out)
		}
		if tc.code == ExitUsage && strings.Count(strings.TrimSpace(errw.String()), "\n") != 0 {
			t.Errorf("%v: usage error is not one line: %q", tc.args, errw.String())
		}
	}
	if Code("prog", errors.New("boom"), &bytes.Buffer{}) != ExitFailure {
		t.Error("a failure did not exit 1")
	}
}

func TestHelpHidesDeprecatedAndShowsEnv(t *testing.T) {
	var out, errw bytes.Buffer
	c, _, _, _ := newCmd(&out, &errw)
	_ = c.Parse([]string{"--help"}, nil)
	if strings.Contains(out.String(), "\n  --spec-dir") {
		t.Errorf("help lists the deprecated alias as a flag:\n%s", out.String())
	}
	for _, want := range []string{"[env PLUGIN_DIR, NVINJECT_CDI_SPEC_DIR]", "--spec-dir (use --cdi-spec-dir)", `(default "5m0s")`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Count(out.String(), "/var/run/cdi") != 1 {
		t.Errorf("help prints the default more than once:\n%s", out.String())
	}
}

func TestPrecedenceAndAliases(t *testing.T) {
	env := map[string]string{"NVINJECT_CDI_SPEC_DIR": "/from-env", "NVINJECT_QUIET_PERIOD": "1m", "NVINJECT_RUNTIME_HANDLER": "a,b"}
	var out, errw bytes.Buffer
	c, s, d, l := newCmd(&out, &errw)
	if err := c.Parse(nil, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *s != "/from-env" || *d != time.Minute || strings.Join(l.Values, ",") != "a,b" {
		t.Errorf("env not applied: %q %v %v", *s, *d, l.Values)
	}

	env["PLUGIN_DIR"] = "/plugin"
	c, s, _, _ = newCmd(&out, &errw)
	_ = c.Parse(nil, func(k string) string { return env[k] })
	if *s != "/plugin" {
		t.Errorf("the explicit alias did not win over the derived one: %q", *s)
	}

	c, s, _, _ = newCmd(&out, &errw)
	if err := c.Parse([]string{"--spec-dir=/old"}, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *s != "/old" || !strings.Contains(errw.String(), "--spec-dir is deprecated") {
		t.Errorf("deprecated alias: value %q, stderr %q", *s, errw.String())
	}

	env["NVINJECT_QUIET_PERIOD"] = "soon"
	c, _, _, _ = newCmd(&out, &errw)
	err := c.Parse(nil, func(k string) string { return env[k] })
	var ue UsageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "NVINJECT_QUIET_PERIOD") {
		t.Errorf("bad env value: %v", err)
	}
}

func TestStringList(t *testing.T) {
	l := NewStringList("/etc/cdi", "/var/run/cdi")
	_ = l.Set("/a,/b")
	_ = l.Set("/c")
	if got := l.String(); got != "/a,/b,/c" {
		t.Errorf("got %q", got)
	}
}

func TestDispatch(t *testing.T) {
	ran := ""
	subs := []Subcommand{{Name: "go", Summary: "runs", Run: func(args []string) error {
		ran = strings.Join(args, " ")
		return nil
	}}}
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"--help"}, ExitOK, "  go  "},
		{[]string{"--version"}, ExitOK, "prog dev"},
		{nil, ExitUsage, ""},
		{[]string{"stop"}, ExitUsage, ""},
		{[]string{"--bogus"}, ExitUsage, ""},
		{[]string{"go", "a", "b"}, ExitOK, ""},
	} {
		var out, errw bytes.Buffer
		if code := Code("prog", Dispatch("prog", subs, tc.args, &out, &errw), &errw); code != tc.code || !strings.Contains(out.String(), tc.out) {
			t.Errorf("%v: code %d out %q err %q", tc.args, code, out.String(), errw.String())
		}
	}
	if ran != "a b" {
		t.Errorf("subcommand got %q", ran)
	}
}
