// Command nvinject-gpucheck is the Go half of e2e/gpu/check.sh, the prepared
// check for a machine with a real NVIDIA GPU, its driver, no network and no
// Go. Subcommands:
//
//	kubelet  a stand-in kubelet: serves the device-plugin Registration
//	         service on DIR/kubelet.sock, then, as kubelet does, dials the
//	         plugin that registers, prints every ListAndWatch update (each
//	         device's health) for --for, and calls Allocate for one Healthy
//	         device, printing the CDI names the plugin answers.
//	oci      writes an OCI bundle's config.json running ARGS on ROOTFS with the
//	         CDI devices injected from --spec-dir, as containerd does for a
//	         CDI name; runc runs it.
//	compare  compares what two CDI specs put into a container for one device
//	         (nvinject's and nvidia-ctk's): mounts, device nodes, hooks, env.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/nvinject/nvinject/shared/cli"
)

const name = "nvinject-gpucheck"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.Code(name, err, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return cli.Usagef("no subcommand: use kubelet, oci or compare (see %s kubelet --help)", name)
	}
	switch args[0] {
	case "kubelet":
		return kubeletCmd(ctx, args[1:], stdout, stderr)
	case "oci":
		return ociCmd(args[1:], stdout, stderr)
	case "compare":
		return compareCmd(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		_, err := fmt.Fprintf(stdout, "usage: %s kubelet|oci|compare [flags]\n\nThe Go half of e2e/gpu/check.sh; each subcommand has --help.\n", name)
		return err
	case "--version":
		return cli.New(name, "").Parse([]string{"--version"}, nil)
	}
	return cli.Usagef("unknown subcommand %q: use kubelet, oci or compare", args[0])
}

// parse parses a subcommand's flags; it reports --help and --version as done.
func parse(c *cli.Command, args []string) (done bool, err error) {
	err = c.Parse(args, nil)
	if errors.Is(err, cli.ErrHelp) || errors.Is(err, cli.ErrVersion) {
		return true, nil
	}
	return false, err
}
