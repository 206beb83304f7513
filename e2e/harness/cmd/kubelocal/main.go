// Command kubelocal runs a real single-node Kubernetes (containerd, etcd,
// kube-apiserver, scheduler, controller-manager, kubelet) on this host for e2e tests.
//
//	kubelocal up     --tools-bin $NVINJECT_TOOLS_BIN
//	kubelocal status
//	kubelocal down
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nvinject/nvinject/e2e/harness/kubelocal"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/logging"
)

const (
	name       = "kubelocal"
	dropInPath = "deploy/containerd/nvinject.toml"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	cancel()
	os.Exit(cli.Code(name, err, os.Stderr))
}

func run(ctx context.Context, args []string) error {
	verb := func(v, summary string) cli.Subcommand {
		return cli.Subcommand{Name: v, Summary: summary, Run: func(args []string) error { return runVerb(ctx, v, args) }}
	}
	return cli.Dispatch(name, []cli.Subcommand{
		verb("up", "start the node (root): containerd, etcd, API server, scheduler, controller-manager, kubelet"),
		verb("status", "list the node's components"),
		verb("down", "stop the node and remove what it left behind"),
	}, args, os.Stdout, os.Stderr)
}

func runVerb(ctx context.Context, verb string, args []string) error {
	var logFlags logging.Flags
	c := cli.New(name+" "+verb, "[flags]")
	fs := c.Flags()
	runDir := fs.String("run-dir", kubelocal.DefaultRunDir, "directory for all node state, sockets and logs (keep it short: unix sockets)")
	toolsBin := fs.String("tools-bin", "", "directory with the pinned binaries (`make tools`; default $NVINJECT_TOOLS_BIN)")
	nodeName := fs.String("node-name", kubelocal.DefaultNodeName, "Kubernetes node name")
	dropIn := fs.String("containerd-dropin", "", "containerd config fragment to merge (default: "+dropInPath+" of this checkout if present; \"none\" to skip)")
	kubeletTmpl := fs.String("kubelet-config", "", "KubeletConfiguration template replacing the embedded one")
	containerdTmpl := fs.String("containerd-config", "", "containerd config template replacing the embedded one")
	pause := fs.String("pause-binary", "", "static pause program for the sandbox image (default: build e2e/cmd/pause)")
	timeout := fs.Duration("timeout", 90*time.Second, "readiness timeout per component")
	workers := fs.String("workers", "", "comma-separated names of more GPU nodes, each with its own containerd, kubelet and namespaces (at most 8)")
	logFlags.Register(fs, logging.Text)
	c.Env("tools-bin", "NVINJECT_TOOLS_BIN")
	if err := c.Parse(args, os.Getenv); err != nil {
		return err
	}
	if len(c.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q", c.Args())
	}
	log, err := logFlags.Logger(os.Stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	slog.SetDefault(log)
	opts := []kubelocal.Option{
		kubelocal.WithRunDir(*runDir), kubelocal.WithToolsBin(*toolsBin), kubelocal.WithNodeName(*nodeName),
		kubelocal.WithKubeletConfigTemplate(*kubeletTmpl), kubelocal.WithContainerdConfigTemplate(*containerdTmpl),
		kubelocal.WithPauseBinary(*pause), kubelocal.WithTimeout(*timeout),
	}
	if *workers != "" {
		opts = append(opts, kubelocal.WithWorkers(strings.Split(*workers, ",")...))
	}
	switch *dropIn {
	case "none":
	case "":
		if found := findDropIn(); found != "" {
			opts = append(opts, kubelocal.WithContainerdDropIn(found))
		}
	default:
		opts = append(opts, kubelocal.WithContainerdDropIn(*dropIn))
	}
	node := kubelocal.New(opts...)
	switch verb {
	case "up":
		if *toolsBin == "" {
			return cli.Usagef("no tools bin dir: run `make tools` and pass --tools-bin or set NVINJECT_TOOLS_BIN")
		}
		if err := node.Up(ctx); err != nil {
			return fmt.Errorf("%w (run `kubelocal down` to clean up)", err)
		}
		fmt.Printf("export KUBECONFIG=%s\nCRI endpoint: unix://%s\nNRI socket: %s\nCDI dir: %s\n",
			node.Kubeconfig(), node.ContainerdSocket(), node.NRISocket(), node.CDIDir())
		return nil
	case "down":
		return node.Down(ctx)
	default:
		return printStatus(node.Status(ctx))
	}
}

func printStatus(st []kubelocal.ComponentStatus) error {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COMPONENT\tPID\tSTATE\tLOG")
	for _, s := range st {
		pid := "-"
		if s.PID != 0 {
			pid = fmt.Sprint(s.PID)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", s.Name, pid, s.Detail, s.LogFile)
	}
	return w.Flush()
}

// findDropIn looks for the deploy drop-in in the checkout containing the working directory.
func findDropIn() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, dropInPath)); err == nil {
				return filepath.Join(dir, dropInPath)
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}
