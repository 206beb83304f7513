package cli

import (
	"fmt"
	"io"
	"strings"
)

// Subcommand is one verb of a binary with several ("nvinject-cdi generate").
type Subcommand struct {
	Name    string
	Summary string
	// Run gets the arguments after the verb; its flags come from a Command
	// named "<binary> <verb>".
	Run func(args []string) error
}

// Dispatch runs the subcommand args[0] names. Before a verb, only --help and
// --version are flags; a missing or unknown verb is a usage error.
func Dispatch(name string, subs []Subcommand, args []string, stdout, stderr io.Writer) error {
	var about strings.Builder
	about.WriteString("Commands:\n")
	for _, s := range subs {
		fmt.Fprintf(&about, "  %-24s %s\n", s.Name, s.Summary)
	}
	fmt.Fprintf(&about, "\nRun '%s <command> --help' for a command's flags.", name)
	top := New(name, "<command> [flags]", WithOutput(stdout, stderr), WithAbout(about.String()))
	if err := top.Parse(args, nil); err != nil {
		return err
	}
	rest := top.Args()
	if len(rest) == 0 {
		return Usagef("a command is required: %s (see %s --help)", names(subs), name)
	}
	for _, s := range subs {
		if s.Name == rest[0] {
			return s.Run(rest[1:])
		}
	}
	return Usagef("unknown command %q: use %s (see %s --help)", rest[0], names(subs), name)
}

func names(subs []Subcommand) string {
	n := make([]string, len(subs))
	for i, s := range subs {
		n[i] = s.Name
	}
	return strings.Join(n, ", ")
}
