// Command nvinject-node prepares a GPU node for nvinject.
//
//	nvinject-node install-containerd-config [--config /etc/containerd/config.toml]
//	    [--dropin-dir /etc/containerd/conf.d] [--dry-run]
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/nvinject/nvinject/deploy/installer"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(os.Args[1:], log); err != nil {
		log.Error("nvinject-node failed", "err", err)
		os.Exit(1)
	}
}

func run(args []string, log *slog.Logger) error {
	if len(args) == 0 || args[0] != "install-containerd-config" {
		return errors.New("usage: nvinject-node install-containerd-config [--config PATH] [--dropin-dir DIR] [--dry-run]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	config := fs.String("config", installer.DefaultConfigPath, "containerd's main config file")
	dropInDir := fs.String("dropin-dir", installer.DefaultDropInDir, "directory for nvinject.toml; config.toml imports <dir>/*.toml")
	dryRun := fs.Bool("dry-run", false, "report the changes, write nothing")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	_, err := installer.New(
		installer.WithConfigPath(*config),
		installer.WithDropInDir(*dropInDir),
		installer.WithDryRun(*dryRun),
		installer.WithLogger(log),
	).Install()
	return err
}
