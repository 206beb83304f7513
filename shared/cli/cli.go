// Package cli gives every nvinject binary the same command-line manners:
// --help prints usage to stdout and exits 0; a usage error prints one line
// naming the flag and exits 2; a failure exits 1; --version prints the
// version and VCS revision. Daemons get environment aliases derived from
// flag names, and renamed flags keep their old name as a warning alias.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/nvinject/nvinject/shared/version"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// ErrHelp and ErrVersion end a run that answered --help or --version.
var (
	ErrHelp    = flag.ErrHelp
	ErrVersion = errors.New("version requested")
)

// UsageError is a bad command line; it exits 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError.
func Usagef(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

// Command is one binary's command line.
type Command struct {
	name, synopsis, about string
	fs                    *flag.FlagSet
	stdout, stderr        io.Writer
	envPrefix             string
	env                   map[string][]string // flag name → its environment names
	deprecated            map[string]string   // old flag name → new
	version               bool
}

// Option configures a Command.
type Option func(*Command)

// WithOutput sets where usage (stdout) and warnings (stderr) go.
func WithOutput(stdout, stderr io.Writer) Option {
	return func(c *Command) { c.stdout, c.stderr = stdout, stderr }
}

// WithEnvPrefix derives an environment alias for every flag: prefix plus the
// flag name upper-cased with '-' as '_' (--cdi-spec-dir: NVINJECT_CDI_SPEC_DIR).
func WithEnvPrefix(prefix string) Option { return func(c *Command) { c.envPrefix = prefix } }

// WithAbout adds a paragraph under the synopsis in --help.
func WithAbout(text string) Option { return func(c *Command) { c.about = text } }

// New returns a Command; synopsis is the usage line after the name
// ("[flags]", "generate|validate [flags]").
func New(name, synopsis string, opts ...Option) *Command {
	c := &Command{
		name: name, synopsis: synopsis, stdout: os.Stdout, stderr: os.Stderr,
		env: map[string][]string{}, deprecated: map[string]string{},
		fs: flag.NewFlagSet(name, flag.ContinueOnError),
	}
	for _, o := range opts {
		o(c)
	}
	c.fs.SetOutput(io.Discard)
	c.fs.BoolVar(&c.version, "version", false, "print the version and VCS revision, then exit")
	return c
}

// Flags is the flag set to define flags on.
func (c *Command) Flags() *flag.FlagSet { return c.fs }

// Name is the program name.
func (c *Command) Name() string { return c.name }

// Env adds environment aliases of flag name (NVIDIA's device plugin's, such as
// NVIDIA_VISIBLE_DEVICES), tried before the derived one.
func (c *Command) Env(name string, envNames ...string) {
	c.env[name] = append(c.env[name], envNames...)
}

// Deprecated keeps old as an alias of flag new: it still works, and says so.
func (c *Command) Deprecated(old, new string) {
	f := c.fs.Lookup(new)
	if f == nil {
		panic("cli: Deprecated(" + old + ", " + new + "): no flag " + new)
	}
	c.deprecated[old] = new
	c.fs.Var(f.Value, old, "deprecated: use --"+new)
}

// EnvNames returns the environment names of flag name, in the order tried.
func (c *Command) EnvNames(name string) []string {
	names := append([]string(nil), c.env[name]...)
	if c.envPrefix != "" && name != "version" {
		if _, old := c.deprecated[name]; !old {
			names = append(names, c.envPrefix+strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
		}
	}
	return names
}

// Parse reads args (without the program name), then the environment
// through getenv (nil: none) for flags not on the command line. It returns
// ErrHelp or ErrVersion after answering them, and a UsageError for a bad
// command line.
func (c *Command) Parse(args []string, getenv func(string) string) error {
	if err := c.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.Usage(c.stdout)
			return ErrHelp
		}
		return UsageError{fmt.Errorf("%w (see %s --help)", err, c.name)}
	}
	if c.version {
		fmt.Fprintln(c.stdout, version.String(c.name))
		return ErrVersion
	}
	set := map[string]bool{}
	c.fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		if n, ok := c.deprecated[f.Name]; ok {
			set[n] = true
			fmt.Fprintf(c.stderr, "%s: warning: --%s is deprecated and will be removed; use --%s\n", c.name, f.Name, n)
		}
	})
	if getenv != nil {
		var err error
		c.fs.VisitAll(func(f *flag.Flag) {
			if set[f.Name] || err != nil {
				return
			}
			for _, e := range c.EnvNames(f.Name) {
				if v := getenv(e); v != "" {
					if serr := f.Value.Set(v); serr != nil {
						err = UsageError{fmt.Errorf("%s=%q (for --%s): %w", e, v, f.Name, serr)}
					}
					return
				}
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Args are the arguments left after the flags.
func (c *Command) Args() []string { return c.fs.Args() }

// Usage writes the help text.
func (c *Command) Usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s %s\n", c.name, c.synopsis)
	if c.about != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.about))
	}
	fmt.Fprintln(w, "\nFlags:")
	var flags []*flag.Flag
	c.fs.VisitAll(func(f *flag.Flag) {
		if _, old := c.deprecated[f.Name]; !old {
			flags = append(flags, f)
		}
	})
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	for _, f := range flags {
		typ, help := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s", f.Name)
		if typ != "" {
			fmt.Fprintf(w, " %s", typ)
		}
		fmt.Fprintf(w, "\n      %s", help)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "[]" {
			fmt.Fprintf(w, " (default %q)", f.DefValue)
		}
		if env := c.EnvNames(f.Name); len(env) > 0 {
			fmt.Fprintf(w, " [env %s]", strings.Join(env, ", "))
		}
		fmt.Fprintln(w)
	}
	if len(c.deprecated) > 0 {
		olds := make([]string, 0, len(c.deprecated))
		for o, n := range c.deprecated {
			olds = append(olds, "--"+o+" (use --"+n+")")
		}
		sort.Strings(olds)
		fmt.Fprintf(w, "\nDeprecated aliases: %s\n", strings.Join(olds, ", "))
	}
}

// Code maps the error a run ended with to the exit code, printing one line
// for a usage error or failure.
func Code(name string, err error, stderr io.Writer) int {
	var ue UsageError
	switch {
	case err == nil, errors.Is(err, ErrHelp), errors.Is(err, ErrVersion):
		return ExitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return ExitFailure
	}
}

// StringList is a flag taking a comma list, repeatable; the first use
// replaces the default.
type StringList struct {
	Values []string
	set    bool
}

// NewStringList returns a StringList holding def until the flag is given.
func NewStringList(def ...string) *StringList { return &StringList{Values: def} }

func (l *StringList) String() string { return strings.Join(l.Values, ",") }

// Set adds the comma-separated values v.
func (l *StringList) Set(v string) error {
	if !l.set {
		l.Values, l.set = nil, true
	}
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			l.Values = append(l.Values, p)
		}
	}
	return nil
}
