package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvinject/nvinject/shared/cli"
)

func ociCmd(args []string, stdout, stderr io.Writer) error {
	c := cli.New(name+" oci", "--cdi-spec-dir DIR --device VENDOR/CLASS=NAME --bundle DIR -- ARGS...", cli.WithOutput(stdout, stderr),
		cli.WithAbout("Writes BUNDLE/config.json: ARGS run in BUNDLE/rootfs with the CDI device's edits (device nodes and their cgroup rules, mounts, env, hooks) applied, as containerd applies a CDI name. Run it with `runc run --bundle BUNDLE ID`."))
	specDir := c.Flags().String("cdi-spec-dir", "", "CDI spec directory")
	device := c.Flags().String("device", "", "fully qualified CDI device name (nvidia.com/gpu=GPU-...)")
	bundle := c.Flags().String("bundle", "", "bundle directory holding rootfs/")
	if done, err := parse(c, args); done || err != nil {
		return err
	}
	if *specDir == "" || *device == "" || *bundle == "" || len(c.Args()) == 0 {
		return cli.Usagef("--spec-dir, --device, --bundle and the container's ARGS (after --) are required")
	}
	spec, err := bundleSpec(*specDir, *device, c.Args())
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(*bundle, "config.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = fmt.Fprintf(stdout, "%s: %s injected from %s: %d device nodes, %d mounts, %d createContainer hooks\n",
		path, *device, *specDir, len(spec.Linux.Devices), len(spec.Mounts), len(spec.Hooks.CreateContainer))
	return err
}

// bundleSpec is a minimal runc container (the namespaces and mounts `runc
// spec` gives, as root) running args, with device's CDI edits injected.
func bundleSpec(specDir, device string, args []string) (*oci.Spec, error) {
	s := &oci.Spec{
		Version: oci.Version,
		Root:    &oci.Root{Path: "rootfs"},
		Process: &oci.Process{
			Cwd:  "/",
			Args: args,
			Env:  []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		},
		Hostname: "nvinject-gpucheck",
		Mounts: []oci.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}},
		},
		Linux: &oci.Linux{
			Namespaces: []oci.LinuxNamespace{
				{Type: oci.PIDNamespace}, {Type: oci.IPCNamespace}, {Type: oci.UTSNamespace}, {Type: oci.MountNamespace}, {Type: oci.NetworkNamespace},
			},
			// Deny every device but what the CDI edits allow, as containerd does.
			Resources: &oci.LinuxResources{Devices: []oci.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
		},
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("read CDI specs in %s: %w", specDir, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		var msgs []string
		for p, es := range errs {
			for _, e := range es {
				msgs = append(msgs, p+": "+e.Error())
			}
		}
		return nil, fmt.Errorf("CDI specs in %s have errors: %s", specDir, strings.Join(msgs, "; "))
	}
	if unresolved, err := cache.InjectDevices(s, device); err != nil {
		return nil, fmt.Errorf("inject %s (unresolved %v; devices in %s: %v): %w", device, unresolved, specDir, cache.ListDevices(), err)
	}
	if s.Hooks == nil {
		s.Hooks = &oci.Hooks{}
	}
	return s, nil
}
