package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvinject/nvinject/shared/cli"
)

func compareCmd(args []string, stdout, stderr io.Writer) error {
	c := cli.New(name+" compare", "--ours FILE --theirs FILE [--device NAME] [--their-device NAME]", cli.WithOutput(stdout, stderr),
		cli.WithAbout("Lists what each CDI spec puts into a container for one device (its edits plus the spec's common edits): container paths of mounts and device nodes, hooks by name, env names; and what only one of them has. Exit 0 with the report; 1 when a spec cannot be read or lacks the device."))
	ours := c.Flags().String("ours", "", "nvinject's spec (YAML or JSON)")
	theirs := c.Flags().String("theirs", "", "the other spec, e.g. nvidia-ctk cdi generate's")
	device := c.Flags().String("device", "", "device name in --ours (the UUID); empty: its first device")
	theirDevice := c.Flags().String("their-device", "", "device name in --theirs (nvidia-ctk's management mode has only \"all\"); default: --device")
	if done, err := parse(c, args); done || err != nil {
		return err
	}
	if *ours == "" || *theirs == "" {
		return cli.Usagef("--ours and --theirs are required")
	}
	a, err := injected(*ours, *device)
	if err != nil {
		return err
	}
	if *theirDevice == "" {
		*theirDevice = *device
	}
	b, err := injected(*theirs, *theirDevice)
	if err != nil {
		return err
	}
	onlyA, onlyB, both := diff(a, b)
	fmt.Fprintf(stdout, "in both: %d\n", len(both))
	for _, x := range onlyB {
		fmt.Fprintf(stdout, "only in %s: %s\n", *theirs, x)
	}
	for _, x := range onlyA {
		fmt.Fprintf(stdout, "only in %s: %s\n", *ours, x)
	}
	_, err = fmt.Fprintf(stdout, "summary: %d only in theirs, %d only in ours\n", len(onlyB), len(onlyA))
	return err
}

// injected reads the spec at path and lists what device (or its first
// device) puts into a container.
func injected(path, device string) ([]string, error) {
	s, err := cdi.ReadSpec(path, 0)
	if err != nil {
		return nil, fmt.Errorf("read CDI spec %s: %w", path, err)
	}
	var dev *cdispec.Device
	for i := range s.Devices {
		if device == "" || s.Devices[i].Name == device {
			dev = &s.Devices[i]
			break
		}
	}
	if dev == nil {
		return nil, fmt.Errorf("CDI spec %s has no device %q", path, device)
	}
	var out []string
	for _, e := range []cdispec.ContainerEdits{s.ContainerEdits, dev.ContainerEdits} {
		for _, m := range e.Mounts {
			out = append(out, "mount "+m.ContainerPath)
		}
		for _, d := range e.DeviceNodes {
			out = append(out, "device "+d.Path)
		}
		for _, h := range e.Hooks {
			out = append(out, "hook "+h.HookName+" "+hookName(h.Args))
		}
		for _, v := range e.Env {
			k, _, _ := strings.Cut(v, "=")
			out = append(out, "env "+k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// hookName is the hook's subcommand: nvidia-cdi-hook and nvinject-cdi-hook
// both take it as their first argument after the program name.
func hookName(args []string) string {
	for _, a := range args[min(1, len(args)):] {
		if !strings.HasPrefix(a, "-") {
			return a
		}
	}
	return ""
}

func diff(a, b []string) (onlyA, onlyB, both []string) {
	for _, x := range a {
		if slices.Contains(b, x) {
			both = append(both, x)
		} else {
			onlyA = append(onlyA, x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			onlyB = append(onlyB, x)
		}
	}
	return onlyA, onlyB, both
}
