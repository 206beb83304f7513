// Command nvinject-cdi generates, validates and lists nvinject's CDI specs,
// and writes SIMULATED driver roots for tests and demos.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
)

const name = "nvinject-cdi"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(cli.Code(name, err, os.Stderr))
}

func run(ctx context.Context, args []string, out, stderr io.Writer) error {
	return cli.Dispatch(name, []cli.Subcommand{
		{Name: "generate", Summary: "write the CDI spec for the node's GPUs", Run: func(a []string) error { return generate(ctx, a, out, stderr) }},
		{Name: "validate", Summary: "check a CDI spec file", Run: func(a []string) error { return validate(a, out, stderr) }},
		{Name: "list", Summary: "list the CDI devices of a spec directory", Run: func(a []string) error { return list(a, out, stderr) }},
		{Name: "simulate-driver-root", Summary: "write a SIMULATED driver root (test and demo equipment)", Run: func(a []string) error { return simulate(ctx, a, out, stderr) }},
	}, args, out, stderr)
}

func generate(ctx context.Context, args []string, out, stderr io.Writer) error {
	c := cli.New(name+" generate", "[flags]", cli.WithOutput(out, stderr))
	fs := c.Flags()
	nvml := fs.String("nvml", backend.Real, "GPU source: real, or sim:a100-80gb[*N][,driver=VERSION] for a SIMULATED node (its driver version follows --driver-root unless driver= is given)")
	root := fs.String("driver-root", "/", "directory holding the driver install")
	hostRoot := fs.String("host-driver-root", "", "the driver root's path on the host, if this process sees it elsewhere")
	devRoot := fs.String("dev-root", "", "the directory whose dev/ holds the GPUs' device nodes (default: --driver-root when it is a whole system root, with usr/bin or usr/lib; else /, as for a driver directory such as /usr/local/nvidia)")
	output := fs.String("output", "", "write the spec to FILE, or - for stdout (default: into --spec-dir)")
	specDir := fs.String("cdi-spec-dir", contract.CDISpecDir, "CDI spec directory")
	vendor := fs.String("cdi-vendor", contract.CDIVendor, "CDI vendor")
	class := fs.String("cdi-class", contract.CDIClass, "CDI class")
	names := fs.String("device-name-strategy", string(spec.NameUUID), "name GPU devices by uuid, or also by index")
	visible := fs.String("visible-devices", "all", "GPUs to include (NVIDIA_VISIBLE_DEVICES semantics)")
	hook := fs.String("hook-binary", "", "host path of the hook program the spec's createContainer hooks run (nvinject-cdi-hook, or NVIDIA's nvidia-cdi-hook): library links, CUDA forward compatibility, ld.so.cache update; empty: no hooks, links as bind mounts")
	c.Deprecated("ldcache-hook", "hook-binary")
	c.Deprecated("spec-dir", "cdi-spec-dir")
	c.Deprecated("vendor", "cdi-vendor")
	c.Deprecated("class", "cdi-class")
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if len(c.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q", c.Args())
	}
	strategy, err := spec.ParseNameStrategy(*names)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	node, devs, err := discover(ctx, *nvml, *root, *devRoot, *visible, stderr)
	if err != nil {
		return err
	}
	opts := []spec.Option{spec.WithVendor(*vendor), spec.WithClass(*class), spec.WithDriverRoot(*root), spec.WithHostDriverRoot(*hostRoot), spec.WithNameStrategy(strategy), spec.WithHookBinary(*hook)}
	s, err := spec.New(opts...).Generate(node, devs)
	if err != nil {
		return err
	}
	switch *output {
	case "":
		p, changed, err := spec.Write(*specDir, s)
		if err != nil {
			return err
		}
		state := "unchanged"
		if changed {
			state = "written"
		}
		_, err = fmt.Fprintf(out, "%s %s (%d GPUs, kind %s)\n", p, state, len(devs), s.Kind)
		return err
	default:
		data, err := yaml.Marshal(s)
		if err != nil {
			return err
		}
		if *output == "-" {
			_, err = out.Write(data)
			return err
		}
		return os.WriteFile(*output, data, 0o644)
	}
}

func discover(ctx context.Context, nvml, root, devRoot, visible string, stderr io.Writer) (gpu.Node, []gpu.Device, error) {
	b, err := backend.Open(nvml, backend.Options{DriverRoot: root, DevRoot: devRoot})
	if err != nil {
		return gpu.Node{}, nil, err
	}
	defer b.Close()
	node, err := b.Discover(ctx)
	if err != nil {
		return gpu.Node{}, nil, err
	}
	sel, err := gpuselect.Parse(visible)
	if err != nil {
		return gpu.Node{}, nil, err
	}
	devs, skipped, err := gpuselect.Select(node.Devices, sel, gpuselect.MIGNone)
	if err != nil {
		return gpu.Node{}, nil, err
	}
	for _, s := range skipped {
		fmt.Fprintln(stderr, "nvinject-cdi: skipping:", s.Reason)
	}
	return node, devs, nil
}

func validate(args []string, out, stderr io.Writer) error {
	c := cli.New(name+" validate", "FILE", cli.WithOutput(out, stderr))
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if args = c.Args(); len(args) != 1 {
		return cli.Usagef("validate takes one spec file: nvinject-cdi validate FILE")
	}
	s, err := cdi.ReadSpec(args[0], 0)
	if err != nil {
		return fmt.Errorf("%s is not a valid CDI spec: %w", args[0], err)
	}
	_, err = fmt.Fprintf(out, "%s: valid CDI %s spec, kind %s, %d devices\n", args[0], s.Version, s.Kind, len(s.Devices))
	return err
}

func list(args []string, out, stderr io.Writer) error {
	c := cli.New(name+" list", "[flags]", cli.WithOutput(out, stderr))
	specDir := c.Flags().String("cdi-spec-dir", contract.CDISpecDir, "CDI spec directory")
	c.Deprecated("spec-dir", "cdi-spec-dir")
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if len(c.Args()) > 0 {
		return cli.Usagef("unexpected arguments %q", c.Args())
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(*specDir), cdi.WithAutoRefresh(false))
	if err != nil && cache == nil {
		return fmt.Errorf("read CDI spec dir %s: %w", *specDir, err)
	}
	for _, d := range cache.ListDevices() {
		if _, err := fmt.Fprintln(out, d); err != nil {
			return err
		}
	}
	var bad []string
	for p, errs := range cache.GetErrors() {
		for _, e := range errs {
			bad = append(bad, fmt.Sprintf("%s: %v", p, e))
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		return fmt.Errorf("spec files with errors (skipped; the devices above are unaffected):\n  %s", strings.Join(bad, "\n  "))
	}
	return nil
}
