// Command nvinject-cdi generates, validates and lists nvinject's CDI specs,
// and writes SIMULATED driver roots for tests and demos.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/cdi/simroot"
	"github.com/nvinject/nvinject/cdi/spec"
	"github.com/nvinject/nvinject/shared/gpu"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

const usage = `nvinject-cdi: CDI specs for the node's NVIDIA GPUs.

Commands:
  generate --nvml=<real|sim:...> --driver-root=DIR [--output=FILE|-] [--spec-dir=DIR]
           [--vendor=nvidia.com] [--class=gpu] [--device-name-strategy=uuid|index]
           [--visible-devices=all] [--hook-binary=/var/lib/nvinject/bin/nvinject-cdi-hook]
  validate FILE
  list --spec-dir=DIR
  simulate-driver-root --nvml=sim:... [--smi=PATH] DIR   (SIMULATION: test/demo equipment)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "nvinject-cdi:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("no command given; run `nvinject-cdi help` for the commands")
	}
	switch args[0] {
	case "generate":
		return generate(ctx, args[1:], out)
	case "validate":
		return validate(args[1:], out)
	case "list":
		return list(args[1:], out)
	case "simulate-driver-root":
		return simulate(ctx, args[1:], out)
	case "-h", "--help", "help":
		_, err := fmt.Fprint(out, usage)
		return err
	}
	return fmt.Errorf("unknown command %q; run `nvinject-cdi help` for the commands", args[0])
}

func generate(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	nvml := fs.String("nvml", backend.Real, "GPU source: real, or sim:a100-80gb[*N][,driver=VERSION] for a SIMULATED node (its driver version follows --driver-root unless driver= is given)")
	root := fs.String("driver-root", "/", "directory holding the driver install")
	hostRoot := fs.String("host-driver-root", "", "the driver root's path on the host, if this process sees it elsewhere")
	output := fs.String("output", "", "write the spec to FILE, or - for stdout (default: into --spec-dir)")
	specDir := fs.String("spec-dir", "/var/run/cdi", "CDI spec directory")
	vendor := fs.String("vendor", spec.DefaultVendor, "CDI vendor")
	class := fs.String("class", spec.DefaultClass, "CDI class")
	names := fs.String("device-name-strategy", string(spec.NameUUID), "name GPU devices by uuid, or also by index")
	visible := fs.String("visible-devices", "all", "GPUs to include (NVIDIA_VISIBLE_DEVICES semantics)")
	hook := fs.String("hook-binary", "", "host path of the hook program the spec's createContainer hooks run (nvinject-cdi-hook, or NVIDIA's nvidia-cdi-hook): library links, CUDA forward compatibility, ld.so.cache update; empty: no hooks, links as bind mounts")
	fs.StringVar(hook, "ldcache-hook", "", "deprecated: use --hook-binary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "ldcache-hook" {
			fmt.Fprintln(os.Stderr, "nvinject-cdi: warning: --ldcache-hook is deprecated and will be removed; use --hook-binary (it now runs every hook)")
		}
	})
	strategy, err := spec.ParseNameStrategy(*names)
	if err != nil {
		return err
	}
	node, devs, err := discover(ctx, *nvml, *root, *visible)
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

func discover(ctx context.Context, nvml, root, visible string) (gpu.Node, []gpu.Device, error) {
	b, err := backend.Open(nvml, backend.Options{DriverRoot: root})
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
		fmt.Fprintln(os.Stderr, "nvinject-cdi: skipping:", s.Reason)
	}
	return node, devs, nil
}

func validate(args []string, out io.Writer) error {
	if len(args) != 1 {
		return errors.New("validate takes one spec file: nvinject-cdi validate FILE")
	}
	s, err := cdi.ReadSpec(args[0], 0)
	if err != nil {
		return fmt.Errorf("%s is not a valid CDI spec: %w", args[0], err)
	}
	_, err = fmt.Fprintf(out, "%s: valid CDI %s spec, kind %s, %d devices\n", args[0], s.Version, s.Kind, len(s.Devices))
	return err
}

func list(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	specDir := fs.String("spec-dir", "/var/run/cdi", "CDI spec directory")
	if err := fs.Parse(args); err != nil {
		return err
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

func simulate(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("simulate-driver-root", flag.ContinueOnError)
	nvml := fs.String("nvml", "sim:a100-80gb", "the SIMULATED node: sim:a100-80gb[*N]")
	smi := fs.String("smi", "", "simulated nvidia-smi binary (default: nvidia-smi-sim next to this program)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("simulate-driver-root takes one directory: nvinject-cdi simulate-driver-root --nvml=sim:a100-80gb DIR")
	}
	if !sim.IsSim(*nvml) {
		return fmt.Errorf("--nvml=%q: a simulated driver root is only for simulated nodes (sim:...)", *nvml)
	}
	if *smi == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		*smi = filepath.Join(filepath.Dir(self), "nvidia-smi-sim")
	}
	b, err := backend.Open(*nvml, backend.Options{})
	if err != nil {
		return err
	}
	defer b.Close()
	node, err := b.Discover(ctx)
	if err != nil {
		return err
	}
	dir := fs.Arg(0)
	if err := simroot.Write(dir, node, *smi); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "SIMULATED driver root for %s (%d GPUs, driver %s) written to %s\n", *nvml, len(node.Devices), node.DriverVersion, dir)
	return err
}
