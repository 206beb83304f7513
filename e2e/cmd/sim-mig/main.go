// Command sim-mig changes the MIG layout of a SIMULATED node at
// runtime, as an operator changes a real one with nvidia-smi: a subset of
// nvidia-smi mig's syntax, applied through NVML's calls on an in-process
// simulated node (shared/gpu/sim) so the driver's placement rules and its
// refusal to destroy an instance in use apply. The result goes to the
// driver root's SIMULATED MIG state file (sim.StateFile), which every
// daemon's simulated NVML follows, and the host gets the new instances'
// /dev/nvidia-caps nodes, as nvidia-modprobe makes them for the real
// driver. It is test equipment; nothing here touches a real GPU.
//
//	sim-mig --driver-root=DIR --nvml=SPEC [--dev-root=/] [--record=FILE] mig -cgi PROFILE[,PROFILE...] -C -i GPU
//	sim-mig --driver-root=DIR --nvml=SPEC [--dev-root=/] [--record=FILE] mig -dci -dgi -i GPU [-gi ID[,ID...]]
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nvinject/nvinject/e2e/internal/hostclean"
	"github.com/nvinject/nvinject/e2e/internal/simdev"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/gpu/nvmlinv"
	"github.com/nvinject/nvinject/shared/gpu/sim"
	"github.com/nvinject/nvinject/shared/gpu/sim/simholders"
)

const (
	name     = "sim-mig"
	synopsis = "--driver-root=DIR --nvml=SPEC [--dev-root=/] [--record=FILE] mig (-cgi PROFILE[,PROFILE...] -C | -dci -dgi [-gi ID[,ID...]]) -i GPU"
	about    = "SIMULATION: changes a simulated node's MIG layout, in nvidia-smi mig's syntax (a subset)."
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type config struct {
	driverRoot, nvml, devRoot, record, procRoot string
	op                                          op
}

// op is one nvidia-smi mig command on one GPU: create GPU instances, each
// with its full compute instance, or destroy GPU instances (all without
// -gi) with their compute instances.
type op struct {
	gpu     int
	create  []string
	destroy bool
	gis     []int
}

// parse reads the command line; --help and --version answer on stdout.
func parse(args []string, stdout, stderr io.Writer) (config, error) {
	cmd := cli.New(name, synopsis, cli.WithAbout(about), cli.WithOutput(stdout, stderr))
	fs := cmd.Flags()
	var c config
	fs.StringVar(&c.driverRoot, "driver-root", "", "the simulated node's driver root (its state file is "+sim.StateFile+" inside)")
	fs.StringVar(&c.nvml, "nvml", "", "the daemons' --nvml=sim:... value")
	fs.StringVar(&c.devRoot, "dev-root", "/", "where the host's /dev is")
	fs.StringVar(&c.record, "record", "", "the file listing the device nodes a harness created (the local node's), which the new ones join")
	fs.StringVar(&c.procRoot, "proc-root", simholders.Proc, "where the processes holding a MIG instance are found")
	if err := cmd.Parse(args, nil); err != nil {
		return config{}, err
	}
	if c.driverRoot == "" || !sim.IsSim(c.nvml) {
		return config{}, cli.Usagef("give the simulated node's --driver-root and its --nvml=sim:... value")
	}
	rest := cmd.Args()
	if len(rest) == 0 || rest[0] != "mig" {
		return config{}, cli.Usagef("the command is mig")
	}
	op, err := parseMIG(rest[1:])
	if err != nil {
		return config{}, cli.UsageError{Err: err}
	}
	c.op = op
	return c, nil
}

// parseMIG parses nvidia-smi mig's options, the subset the simulation does.
func parseMIG(args []string) (op, error) {
	o := op{gpu: -1}
	var fullCI, dci, dgi bool
	value := func(i int) (string, error) {
		if i+1 >= len(args) || strings.HasPrefix(args[i+1], "-") {
			return "", fmt.Errorf("%s needs a value", args[i])
		}
		return args[i+1], nil
	}
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "-C":
			fullCI = true
		case "-dci":
			dci = true
		case "-dgi":
			dgi = true
		case "-cgi", "-i", "-gi":
			v, err := value(i)
			if err != nil {
				return op{}, err
			}
			i++
			switch a {
			case "-cgi":
				o.create = strings.Split(v, ",")
			case "-i":
				if o.gpu, err = strconv.Atoi(v); err != nil || o.gpu < 0 {
					return op{}, fmt.Errorf("-i %q: give one GPU index", v)
				}
			case "-gi":
				for f := range strings.SplitSeq(v, ",") {
					id, err := strconv.Atoi(f)
					if err != nil || id < 0 {
						return op{}, fmt.Errorf("-gi %q: give GPU instance IDs joined with commas", v)
					}
					o.gis = append(o.gis, id)
				}
			}
		default:
			return op{}, fmt.Errorf("mig option %q is not in the simulation's subset (-cgi, -C, -dci, -dgi, -i, -gi)", a)
		}
	}
	o.destroy = dci || dgi
	switch {
	case o.gpu < 0:
		return op{}, errors.New("give the GPU with -i")
	case len(o.create) > 0 && o.destroy:
		return op{}, errors.New("-cgi and -dci/-dgi are two commands; run them one after the other")
	case len(o.create) > 0 && !fullCI:
		return op{}, errors.New("-cgi without -C: the simulation creates each GPU instance with its full compute instance; add -C")
	case len(o.create) > 0 && len(o.gis) > 0:
		return op{}, errors.New("-gi selects instances to destroy; -cgi takes none")
	case o.destroy && !(dci && dgi):
		return op{}, errors.New("the simulation destroys GPU instances with their compute instances: give -dci -dgi")
	case len(o.create) == 0 && !o.destroy:
		return op{}, errors.New("give -cgi PROFILE[,PROFILE] -C or -dci -dgi")
	}
	for _, p := range o.create {
		if p == "" {
			return op{}, errors.New("-cgi has an empty profile; join profiles with commas")
		}
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, stdout, stderr)
	if err != nil {
		return cli.Code(name, err, stderr)
	}
	if err := apply(ctx, c, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "sim-mig:", err)
		return 1
	}
	return 0
}

// apply runs c's command on the node the state file (or the --nvml value)
// describes and records what changed, even when the command stopped
// partway, as instances the driver created stay created.
func apply(ctx context.Context, c config, stdout, stderr io.Writer) error {
	spec, err := sim.ParseSpec(c.nvml)
	if err != nil {
		return err
	}
	file := filepath.Join(c.driverRoot, sim.StateFile)
	node := sim.New(spec, sim.WithStateFile(file), sim.WithProcRoot(c.procRoot))
	if err := node.Follow(); err != nil {
		return err
	}
	before := node.State()
	var runErr error
	if c.op.destroy {
		runErr = destroy(node, c.op, before, stdout, stderr)
	} else {
		runErr = create(node, c.op, stdout)
	}
	st, err := node.SaveState()
	if err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Fprintf(stdout, "SIMULATION: wrote generation %d of the simulated MIG state %s\n", st.Generation, file)
	inv, err := nvmlinv.New(node.NVML(), nvmlinv.WithNodeLookup(node.Nodes()), nvmlinv.WithCaps(node.ProcFS(), "the SIMULATED driver's procfs"), nvmlinv.WithSimulated())
	if err != nil {
		return errors.Join(runErr, err)
	}
	defer inv.Close()
	discovered, err := inv.Discover(ctx)
	if err != nil {
		return errors.Join(runErr, err)
	}
	if err := hostclean.AddDevices(c.record, simdev.MIGNodes(discovered, c.devRoot)); err != nil {
		return errors.Join(runErr, fmt.Errorf("create the new instances' /dev/nvidia-caps nodes under %s: %w", c.devRoot, err))
	}
	return runErr
}

func create(node *sim.Node, o op, stdout io.Writer) error {
	for _, p := range o.create {
		gi, ci, err := node.CreateGPUInstance(o.gpu, p)
		if err != nil {
			return fmt.Errorf("unable to create a GPU instance on GPU %d using profile %s: %w", o.gpu, p, err)
		}
		g, c := lookup(node.State(), o.gpu, gi, ci)
		fmt.Fprintf(stdout, "Successfully created GPU instance ID %2d on GPU %2d using profile MIG %s\n", gi, o.gpu, g.Profile)
		fmt.Fprintf(stdout, "Successfully created compute instance ID %2d on GPU %2d GPU instance ID %2d using profile MIG %s\n", ci, o.gpu, gi, c.Profile)
		fmt.Fprintf(stdout, "  MIG device %s\n", c.UUID)
	}
	return nil
}

func destroy(node *sim.Node, o op, before sim.State, stdout, stderr io.Writer) error {
	gis := o.gis
	if len(gis) == 0 {
		for _, g := range gpuOf(before, o.gpu).GPUInstances {
			gis = append(gis, g.ID)
		}
		if len(gis) == 0 {
			return fmt.Errorf("GPU %d has no GPU instances to destroy", o.gpu)
		}
	}
	for _, id := range gis {
		g, _ := lookup(before, o.gpu, id, -1)
		if err := node.DestroyGPUInstance(o.gpu, id); errors.Is(err, sim.ErrInUse) {
			fmt.Fprintf(stderr, "Unable to destroy GPU instance ID %2d from GPU %2d: In use by another client\n", id, o.gpu)
			return fmt.Errorf("failed to destroy GPU instances: In use by another client (%w)", err)
		} else if err != nil {
			return fmt.Errorf("unable to destroy GPU instance ID %d from GPU %d: %w", id, o.gpu, err)
		}
		for _, c := range g.ComputeInstances {
			fmt.Fprintf(stdout, "Successfully destroyed compute instance ID %2d from GPU %2d GPU instance ID %2d (MIG device %s)\n", c.ID, o.gpu, id, c.UUID)
		}
		fmt.Fprintf(stdout, "Successfully destroyed GPU instance ID %2d from GPU %2d\n", id, o.gpu)
	}
	return nil
}

func gpuOf(s sim.State, index int) sim.GPUState {
	for _, g := range s.GPUs {
		if g.Index == index {
			return g
		}
	}
	return sim.GPUState{}
}

// lookup finds GPU instance gi of a GPU and its compute instance ci.
func lookup(s sim.State, index, gi, ci int) (sim.GIState, sim.CIState) {
	for _, g := range gpuOf(s, index).GPUInstances {
		if g.ID != gi {
			continue
		}
		for _, c := range g.ComputeInstances {
			if c.ID == ci {
				return g, c
			}
		}
		return g, sim.CIState{}
	}
	return sim.GIState{}, sim.CIState{}
}
