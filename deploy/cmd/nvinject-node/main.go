// Command nvinject-node prepares a GPU node for nvinject.
//
//	nvinject-node install-containerd-config [--config /etc/containerd/config.toml]
//	    [--dropin-dir /etc/containerd/conf.d] [--dry-run]
package main

import (
	"io"
	"os"

	"github.com/nvinject/nvinject/deploy/installer"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/logging"
)

const name = "nvinject-node"

func main() {
	os.Exit(cli.Code(name, run(os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) error {
	return cli.Dispatch(name, []cli.Subcommand{{
		Name:    "install-containerd-config",
		Summary: "install nvinject's containerd drop-in and import it from config.toml (idempotent)",
		Run:     func(args []string) error { return install(args, stdout, stderr) },
	}}, args, stdout, stderr)
}

func install(args []string, stdout, stderr io.Writer) error {
	var logFlags logging.Flags
	c := cli.New(name+" install-containerd-config", "[flags]", cli.WithOutput(stdout, stderr))
	fs := c.Flags()
	config := fs.String("config", installer.DefaultConfigPath, "containerd's main config file")
	dropInDir := fs.String("dropin-dir", installer.DefaultDropInDir, "directory for nvinject.toml; config.toml imports <dir>/*.toml")
	dryRun := fs.Bool("dry-run", false, "report the changes, write nothing")
	logFlags.Register(fs, logging.Text)
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if len(c.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q", c.Args())
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	_, err = installer.New(
		installer.WithConfigPath(*config),
		installer.WithDropInDir(*dropInDir),
		installer.WithDryRun(*dryRun),
		installer.WithLogger(log),
	).Install()
	return err
}
