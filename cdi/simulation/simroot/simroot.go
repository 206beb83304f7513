//go:build !nosim

// Package simroot writes a SIMULATED NVIDIA driver root: a directory shaped
// like a real driver install (versioned libraries indexed by ld.so.cache,
// nvidia-smi, firmware) for the simulated GPUs. Test and demo equipment.
package simroot

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"

	"github.com/nvinject/nvinject/cdi/driver"
	"github.com/nvinject/nvinject/cdi/ldcache"
	"github.com/nvinject/nvinject/cdi/simulation/simfacts"
	"github.com/nvinject/nvinject/shared/gpu"
)

// LibDir is where the simulated driver's libraries live.
const LibDir = "/usr/lib/x86_64-linux-gnu"

// sonames maps each simulated library to its soname's suffix.
var sonames = map[string]string{"libnvidia-nvvm": ".so.4"}

// Write creates the simulated driver root for node in dir. smi is the
// simulated nvidia-smi binary copied to usr/bin/nvidia-smi.
func Write(dir string, node gpu.Node, smi string) error {
	v := node.DriverVersion
	var entries []ldcache.Entry
	for _, lib := range []string{"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm", "libnvidia-cfg", "libnvidia-allocator", "libnvidia-gpucomp"} {
		file := lib + ".so." + v
		body := fmt.Sprintf("SIMULATED %s for nvinject's simulated driver %s; not a loadable library\n", lib, v)
		if err := writeFile(filepath.Join(dir, LibDir, file), []byte(body), 0o644); err != nil {
			return err
		}
		suffix, ok := sonames[lib]
		if !ok {
			suffix = ".so.1"
		}
		soname := lib + suffix
		link := filepath.Join(dir, LibDir, soname)
		_ = os.Remove(link)
		if err := os.Symlink(file, link); err != nil {
			return fmt.Errorf("link %s: %w", link, err)
		}
		entries = append(entries, ldcache.Entry{Flags: ldcache.FlagELFLibc6 | ldcache.FlagX8664, Name: soname, Path: path.Join(LibDir, soname)})
	}
	if err := writeFile(filepath.Join(dir, "etc/ld.so.cache"), ldcache.Marshal(entries), 0o644); err != nil {
		return err
	}
	for _, fw := range []string{"gsp_ga10x.bin", "gsp_tu10x.bin"} {
		if err := writeFile(filepath.Join(dir, "lib/firmware/nvidia", v, fw), []byte("SIMULATED GSP firmware\n"), 0o644); err != nil {
			return err
		}
	}
	if err := copyFile(smi, filepath.Join(dir, "usr/bin/nvidia-smi")); err != nil {
		return fmt.Errorf("install the simulated nvidia-smi from %s: %w; build it with `make build` (bin/nvidia-smi-sim)", smi, err)
	}
	facts := simfacts.Facts{Simulated: simfacts.Notice, DriverVersion: v, CUDAVersion: node.CUDAVersion}
	for _, d := range node.Devices {
		g := simfacts.GPU{Index: d.Index, Minor: d.Minor, UUID: d.UUID, Name: d.Name, MemoryMiB: d.MemoryBytes >> 20, PCIBusID: d.PCIBusID, MIG: d.MIGEnabled}
		for _, m := range d.MIG {
			g.MIGDevices = append(g.MIGDevices, simfacts.MIGDevice{UUID: m.UUID, Profile: m.Profile, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance,
				CIAccessMinor: int(m.CIAccess.Minor), MemoryMiB: m.MemoryBytes >> 20})
		}
		facts.GPUs = append(facts.GPUs, g)
	}
	data, err := json.MarshalIndent(facts, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, driver.SimulatedFacts), append(data, '\n'), 0o644); err != nil {
		return err
	}
	readme := "This is a SIMULATED NVIDIA driver root written by nvinject for tests and demos.\n" +
		"Its libraries are placeholders and its nvidia-smi reports simulated GPUs.\n"
	return writeFile(filepath.Join(dir, "README-SIMULATED.txt"), []byte(readme), 0o644)
}

func writeFile(p string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, data, mode)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
