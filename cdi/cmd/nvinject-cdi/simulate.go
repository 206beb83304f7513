//go:build !nosim

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/nvinject/nvinject/cdi/simulation/simroot"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

func simulate(ctx context.Context, args []string, out, stderr io.Writer) error {
	c := cli.New(name+" simulate-driver-root", "[flags] DIR", cli.WithOutput(out, stderr), cli.WithAbout("SIMULATION: writes a driver root of placeholder libraries and nvidia-smi-sim, for tests and demos."))
	fs := c.Flags()
	nvml := fs.String("nvml", "sim:a100-80gb", "the SIMULATED node: sim:a100-80gb[*N]")
	smi := fs.String("smi", "", "simulated nvidia-smi binary (default: nvidia-smi-sim next to this program)")
	if err := c.Parse(args, nil); err != nil {
		return err
	}
	if len(c.Args()) != 1 {
		return cli.Usagef("simulate-driver-root takes one directory: nvinject-cdi simulate-driver-root --nvml=sim:a100-80gb DIR")
	}
	if !sim.IsSim(*nvml) {
		return cli.Usagef("--nvml=%q: a simulated driver root is only for simulated nodes (sim:...)", *nvml)
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
	dir := c.Args()[0]
	if err := simroot.Write(dir, node, *smi); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "SIMULATED driver root for %s (%d GPUs, driver %s) written to %s\n", *nvml, len(node.Devices), node.DriverVersion, dir)
	return err
}
