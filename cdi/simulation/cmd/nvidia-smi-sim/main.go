//go:build !nosim

// Command nvidia-smi-sim is the SIMULATED nvidia-smi that nvinject installs
// into simulated driver roots. Inside a container it reports the simulated
// GPUs whose device nodes (/dev/nvidiaN, major 195) the container has, so a
// test can see which GPU was really injected; -L lists under each the MIG
// devices whose compute instance access node (/dev/nvidia-caps) it has. It
// never touches a real GPU.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/nvinject/nvinject/cdi/simulation/simfacts"
	"github.com/nvinject/nvinject/shared/cli"
)

const factsPath = "/usr/share/nvinject/simulated-gpus.json"

// On the simulated node's host there are no /dev/nvidiaN nodes, so the
// host's view (`nvidia-smi` on the worker) is asked for
// explicitly: NVINJECT_SIM_FACTS names the facts file of a simulated driver
// root, and NVINJECT_SIM_HOST_VIEW=1 reports every GPU in it.
func main() {
	facts, dev := factsPath, "/dev"
	if f := os.Getenv("NVINJECT_SIM_FACTS"); f != "" {
		facts = f
	}
	if os.Getenv("NVINJECT_SIM_HOST_VIEW") == "1" {
		dev = ""
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, facts, dev))
}

func run(args []string, stdout, stderr io.Writer, facts, dev string) int {
	c := cli.New("nvidia-smi-sim", "[--query-gpu=FIELDS --format=csv[,noheader]] | [-L]", cli.WithOutput(stdout, stderr),
		cli.WithAbout("The SIMULATED nvidia-smi: reports the simulated GPUs whose /dev/nvidiaN the container has (NVINJECT_SIM_FACTS names the facts file; NVINJECT_SIM_HOST_VIEW=1 reports every GPU). It never touches a real GPU."))
	fs := c.Flags()
	query := fs.String("query-gpu", "", "comma list of fields: index,uuid,name,memory.total,pci.bus_id,driver_version,mig.mode.current,mig.mode.pending")
	format := fs.String("format", "", "csv[,noheader][,nounits]")
	list := fs.Bool("L", false, "list GPUs")
	if err := c.Parse(args, nil); err != nil {
		return cli.Code("nvidia-smi-sim", err, stderr)
	}
	f, err := simfacts.Read(facts)
	if err != nil {
		fmt.Fprintln(stdout, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. (simulated: no facts file)")
		return 9
	}
	gpus := visible(f, dev)
	if len(gpus) == 0 {
		fmt.Fprintln(stdout, "No devices were found")
		return 6
	}
	switch {
	case *list:
		for _, g := range gpus {
			fmt.Fprintf(stdout, "GPU %d: %s (UUID: %s) [SIMULATED]\n", g.Index, g.Name, g.UUID)
			for i, m := range visibleMIG(g, dev) {
				fmt.Fprintf(stdout, "  MIG %-11s Device %2d: (UUID: %s)\n", m.Profile, i, m.UUID)
			}
		}
	case *query != "":
		return queryCSV(stdout, stderr, f, gpus, *query, *format)
	default:
		fmt.Fprintf(stdout, "NVIDIA-SMI (SIMULATED by nvinject)  Driver Version: %s  CUDA Version: %s\n", f.DriverVersion, f.CUDAVersion)
		for _, g := range gpus {
			fmt.Fprintf(stdout, "|  %d  %-28s  %s  %6d MiB  %s |\n", g.Index, g.Name, g.PCIBusID, g.MemoryMiB, g.UUID)
		}
	}
	return 0
}

// visible returns the GPUs whose device node is in dev with the right
// major and minor, as NVML inside a container only opens nodes it has. An
// empty dev is the simulated host's view: every GPU.
func visible(f simfacts.Facts, dev string) []simfacts.GPU {
	if dev == "" {
		return f.GPUs
	}
	var out []simfacts.GPU
	for _, g := range f.GPUs {
		if major, minor, ok := charDevice(filepath.Join(dev, "nvidia"+strconv.Itoa(g.Minor))); ok && major == 195 && minor == g.Minor {
			out = append(out, g)
		}
	}
	return out
}

// visibleMIG returns g's MIG devices whose CI access node
// (nvidia-caps/nvidia-cap<minor>, any major: the driver picks it at load)
// is in dev; a container with only the parent's node sees none, as real
// NVML. An empty dev is the host's view: all of them.
func visibleMIG(g simfacts.GPU, dev string) []simfacts.MIGDevice {
	if dev == "" {
		return g.MIGDevices
	}
	var out []simfacts.MIGDevice
	for _, m := range g.MIGDevices {
		if _, minor, ok := charDevice(filepath.Join(dev, "nvidia-caps", "nvidia-cap"+strconv.Itoa(m.CIAccessMinor))); ok && minor == m.CIAccessMinor {
			out = append(out, m)
		}
	}
	return out
}

// charDevice returns the numbers of the character device at path.
func charDevice(path string) (major, minor int, ok bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
		return 0, 0, false
	}
	rdev := uint64(st.Rdev)
	return int((rdev >> 8) & 0xfff), int((rdev & 0xff) | ((rdev >> 12) &^ 0xff)), true
}

func queryCSV(stdout, stderr io.Writer, f simfacts.Facts, gpus []simfacts.GPU, query, format string) int {
	noHeader := strings.Contains(format, "noheader")
	noUnits := strings.Contains(format, "nounits")
	fields := strings.Split(query, ",")
	if !noHeader {
		fmt.Fprintln(stdout, strings.Join(fields, ", "))
	}
	for _, g := range gpus {
		row := make([]string, len(fields))
		for i, fld := range fields {
			switch strings.TrimSpace(fld) {
			case "index":
				row[i] = strconv.Itoa(g.Index)
			case "uuid", "gpu_uuid":
				row[i] = g.UUID
			case "name", "gpu_name":
				row[i] = g.Name
			case "memory.total":
				row[i] = strconv.FormatUint(g.MemoryMiB, 10)
				if !noUnits {
					row[i] += " MiB"
				}
			case "pci.bus_id":
				row[i] = "0000" + g.PCIBusID
			case "driver_version":
				row[i] = f.DriverVersion
			case "mig.mode.current", "mig.mode.pending":
				// The simulation changes MIG mode only with its layout, never
				// pending a reset.
				row[i] = "Disabled"
				if g.MIG {
					row[i] = "Enabled"
				}
			default:
				fmt.Fprintf(stderr, "Field \"%s\" is not a valid field to query.\n", fld)
				return 2
			}
		}
		fmt.Fprintln(stdout, strings.Join(row, ", "))
	}
	return 0
}
