// Command nvinject-cdi-hook is the OCI createContainer hook program
// nvinject's CDI specs call (nvinject-cdi generate --hook-binary): it makes
// the driver libraries' links, enables the image's CUDA forward
// compatibility libraries and writes the image's ld.so.cache, inside the
// container's root file system and nowhere else, running no other program.
// Its commands and flags are those of NVIDIA's nvidia-cdi-hook, so a spec
// may name either program. It is built static (CGO_ENABLED=0) so it runs
// on any node, and it starts by emptying its environment: a runtime may
// hand a hook the container's (runc before 1.3 does when the hook has no
// env), and nothing in it is honoured.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/nvinject/nvinject/cdi/hook"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/version"
)

const name = "nvinject-cdi-hook"

const usage = `Usage: nvinject-cdi-hook COMMAND [flags]   (state of the container on stdin)

An OCI createContainer hook run by the container runtime for CDI specs made
with nvinject-cdi generate --hook-binary. It works only inside the
container's root file system (from the OCI state on stdin), resolving every
path there with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS), and runs no
other program; its environment is ignored.

Commands:
  create-symlinks --link TARGET::LINK ...     make symlinks in the container
  enable-cuda-compat --host-driver-version=V  use the image's CUDA forward
                                              compatibility libraries when V supports them
  update-ldcache --folder DIR ...             index DIR in the image's ld.so.cache
                                              (written by this program, as ldconfig would)
  install DIR                                 copy this program to DIR/nvinject-cdi-hook
                                              (the device plugin's init container; no stdin)

Run nvinject-cdi-hook COMMAND --help for a command's flags; --version prints
the version.
`

func main() {
	// First, before flags are read: nothing from the environment a
	// runtime hands a hook (the container's, with runc < 1.3) is honoured.
	os.Clearenv()
	os.Exit(cli.Code(name, run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr), os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return cli.Usagef("no command given; run %s --help for the commands", name)
	}
	switch args[0] {
	case "-h", "--help", "help":
		_, err := fmt.Fprint(stdout, usage)
		return err
	case "--version", "-version", "version":
		_, err := fmt.Fprintln(stdout, version.String(name))
		return err
	}
	sub, args := args[0], args[1:]
	if sub == "install" {
		return install(args, stdout, stderr)
	}
	c := cli.New(name+" "+sub, "[flags] < OCI state", cli.WithOutput(stdout, stderr))
	fs := c.Flags()
	var work func(r *hook.Root) error
	switch sub {
	case "create-symlinks":
		var links multi
		fs.Var(&links, "link", "a link to make, TARGET::LINK (repeatable); LINK is replaced if it exists")
		work = func(r *hook.Root) error {
			for _, l := range links {
				if _, _, err := hook.ParseLink(l); err != nil {
					return cli.UsageError{Err: err}
				}
			}
			return hook.CreateSymlinks(r, links)
		}
	case "enable-cuda-compat":
		host := fs.String("host-driver-version", "", "the host's driver version; the image's compat libraries are used when their ELF note lists its branch and they are newer (without the note: a higher major version)")
		fs.String("host-cuda-version", "", "accepted for nvidia-cdi-hook compatibility; the driver version decides")
		dir := fs.String("cuda-compat-container-root", "/usr/local/cuda/compat", "where the image keeps its CUDA forward compatibility libraries")
		work = func(r *hook.Root) error {
			on, err := hook.EnableCUDACompat(r, *host, *dir)
			if on {
				fmt.Fprintf(stderr, "%s: CUDA forward compatibility: %s is newer than host driver %s; listed in %s\n", name, *dir, *host, hook.CompatConf)
			}
			return err
		}
	case "update-ldcache":
		var folders multi
		fs.Var(&folders, "folder", "a library directory to index (repeatable)")
		fs.String("ldconfig-path", "/sbin/ldconfig", "accepted for nvidia-cdi-hook compatibility; no ldconfig runs: this program writes the cache")
		work = func(r *hook.Root) error {
			_, err := hook.UpdateLDCache(r, folders)
			return err
		}
	case "disable-device-node-modification", "chmod", "update-application-profile":
		return cli.Usagef("%s is an nvidia-cdi-hook command nvinject's specs do not use; use NVIDIA's nvidia-cdi-hook for specs that need it", sub)
	default:
		return cli.Usagef("unknown command %q; run %s --help for the commands", sub, name)
	}
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if len(c.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q (see %s %s --help)", c.Args(), name, sub)
	}
	r, err := hook.OpenContainerRoot(stdin)
	if err != nil {
		return fmt.Errorf("%s: %w", sub, err)
	}
	defer r.Close()
	if err := work(r); err != nil {
		return fmt.Errorf("%s: %w", sub, err)
	}
	return nil
}

func install(args []string, stdout, stderr io.Writer) error {
	c := cli.New(name+" install", "DIR", cli.WithOutput(stdout, stderr))
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if len(c.Args()) != 1 {
		return cli.Usagef("install takes one directory: %s install /var/lib/nvinject/bin", name)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install: find this program: %w", err)
	}
	dst, err := hook.Install(self, c.Args()[0])
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "installed %s\n", dst)
	return err
}

// multi collects each use of a repeatable flag as one value (a link or
// folder may hold a comma).
type multi []string

func (m *multi) String() string { return fmt.Sprint([]string(*m)) }

func (m *multi) Set(v string) error {
	*m = append(*m, v)
	return nil
}
