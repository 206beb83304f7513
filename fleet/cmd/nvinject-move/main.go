// Command nvinject-move moves GPU nodes between nvinject's device plugin and
// nvinject-dra, and rolls a driver upgrade through them, one node (or
// --max-unavailable) at a time: cordon, evict the GPU pods (PodDisruptionBudgets
// respected), change, wait until the node publishes its GPUs again, uncordon.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/fleet/move"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/kubeclient"
	"github.com/nvinject/nvinject/shared/logging"
)

const name = "nvinject-move"

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	cancel()
	os.Exit(cli.Code(name, err, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	sub := func(verb, summary string) cli.Subcommand {
		return cli.Subcommand{Name: verb, Summary: summary, Run: func(args []string) error { return runVerb(ctx, verb, args, getenv, stdout, stderr) }}
	}
	return cli.Dispatch(name, []cli.Subcommand{
		sub("move", "move NODE (or --all --selector) to --to=dra|device-plugin, safely"),
		sub("upgrade", "roll NODE (or --all --selector) to --driver-version, running --run on each"),
	}, args, stdout, stderr)
}

func runVerb(ctx context.Context, verb string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var logFlags logging.Flags
	c := cli.New(name+" "+verb, "[flags] [NODE]", cli.WithOutput(stdout, stderr))
	fs := c.Flags()
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default: the pod's service account)")
	to := fs.String("to", "", "move: the path, "+contract.DRAModeDRA+" or "+contract.DRAModeDevicePlugin)
	version := fs.String("driver-version", "", "upgrade: the driver version the node must report when done (label "+contract.GFDLabelDriverVersion+")")
	command := fs.String("run", "", "upgrade: the command that upgrades one node's driver (sh -c, NVINJECT_NODE set)")
	all := fs.Bool("all", false, "every node --selector matches, in name order")
	selector := fs.String("selector", "", "with --all: the nodes' label selector")
	maxUnavailable := fs.Int("max-unavailable", 1, "with --all: nodes changed at once")
	timeout := fs.Duration("timeout", 5*time.Minute, "bound of each waiting step (evictions, the new owner)")
	dryRun := fs.Bool("dry-run", false, "print the plan; change nothing")
	drain := fs.Bool("drain-claims", false, "move to the device plugin: evict the pods of DRA claims still prepared on the node instead of refusing")
	asJSON := fs.Bool("json", false, "print the reports as JSON")
	logFlags.Register(fs, logging.Text)
	c.Env("kubeconfig", "KUBECONFIG")
	if err := c.Parse(flagsFirst(fs, args), getenv); err != nil {
		return err
	}
	var nodes []string
	switch {
	case *all && len(c.Args()) > 0:
		return cli.Usagef("give NODE or --all, not both")
	case !*all && len(c.Args()) != 1:
		return cli.Usagef("give one NODE, or --all --selector=...")
	case *all && *selector == "":
		return cli.Usagef("--all needs --selector (e.g. %s=%s)", contract.GFDLabelProduct, "NVIDIA-A100-SXM4-80GB")
	case !*all:
		nodes = c.Args()
	}
	if verb == "move" && *to != contract.DRAModeDRA && *to != contract.DRAModeDevicePlugin {
		return cli.Usagef("--to=%q: use %s or %s", *to, contract.DRAModeDRA, contract.DRAModeDevicePlugin)
	}
	if verb == "upgrade" && *version == "" {
		return cli.Usagef("upgrade needs --driver-version")
	}
	if *maxUnavailable < 1 {
		return cli.Usagef("--max-unavailable=%d: give 1 or more", *maxUnavailable)
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	cfg, err := kubeclient.Config(*kubeconfig, name)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("API client: %w", err)
	}
	opts := []move.Option{move.WithTimeout(*timeout), move.WithLogger(log)}
	if *dryRun {
		opts = append(opts, move.WithDryRun())
	}
	if *drain {
		opts = append(opts, move.WithDrainClaims())
	}
	m := move.New(cs, opts...)
	if *all {
		if nodes, err = m.Nodes(ctx, *selector); err != nil {
			return err
		}
	}
	do := func(ctx context.Context, node string) (move.Report, error) {
		if verb == "move" {
			return m.Move(ctx, node, *to)
		}
		return m.Upgrade(ctx, node, *version, *command)
	}
	reports, err := move.Roll(ctx, nodes, *maxUnavailable, do)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(reports); jerr != nil {
			return jerr
		}
	} else {
		printReports(stdout, reports)
	}
	return err
}

// flagsFirst moves the positional arguments after the flags, so that
// `move NODE --to=dra` reads as kubectl's `drain NODE --force` does.
func flagsFirst(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return append(append(flags, "--"), append(pos, args[i+1:]...)...)
		case !strings.HasPrefix(a, "-") || a == "-":
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		if f := fs.Lookup(name); f != nil && i+1 < len(args) {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
				i++
				flags = append(flags, args[i])
			}
		}
	}
	if len(pos) == 0 {
		return flags
	}
	return append(append(flags, "--"), pos...)
}

func printReports(w io.Writer, reports []move.Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range reports {
		switch {
		case r.NoOp:
			fmt.Fprintf(tw, "%s\t%s\talready %s: nothing to do\n", r.Node, r.Action, r.To)
			continue
		case r.DryRun:
			fmt.Fprintf(tw, "%s\t%s\t%s -> %s (dry run)\n", r.Node, r.Action, r.From, r.To)
		default:
			fmt.Fprintf(tw, "%s\t%s\t%s -> %s\n", r.Node, r.Action, r.From, r.To)
		}
		for _, s := range r.Steps {
			fmt.Fprintf(tw, "\t  %s\t%s\t%s\n", s.Name, s.Took.Round(time.Millisecond), s.Detail)
		}
		if r.Error != "" {
			fmt.Fprintf(tw, "\t  FAILED\t\t%s (the node stays cordoned, annotation %s)\n", r.Error, move.Failed)
		}
	}
	tw.Flush()
}
