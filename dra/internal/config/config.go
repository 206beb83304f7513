// Package config reads nvinject-dra's configuration from flags and their
// environment aliases (shared/cli: NVINJECT_<FLAG>, plus NVIDIA's
// NVIDIA_VISIBLE_DEVICES and MIG_STRATEGY, and NODE_NAME/KUBECONFIG): the
// GPU node's settings (gpunode/nodeconfig) and the DRA protocol's own. It
// is the only place the DRA driver reads the environment.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/nvinject/nvinject/gpunode/nodeconfig"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
)

// Name is the program name.
const Name = "nvinject-dra"

// Config is nvinject-dra's effective configuration.
type Config struct {
	nodeconfig.Config
	// RegistrarDir is kubelet's plugins_registry; PluginDir holds dra.sock.
	RegistrarDir string
	PluginDir    string
	// HoldEndpoint registers an empty device-plugin endpoint for
	// ResourceName in KubeletDir (gpunode/kubelet/endpoint says why).
	HoldEndpoint bool
	KubeletDir   string
	// OwnerLabel is the node label deploy/ selects nvinject-dra by (value
	// dra); empty when it runs on every node.
	OwnerLabel string
	// Shares publishes each GPU's share device (consumable capacity,
	// KEP-5075), enforced by an MPS daemon per share.
	Shares bool
	// MIGOnDemand publishes a MIG GPU without instances by its placements
	// and makes a claim's MIG device at prepare.
	MIGOnDemand bool
}

// Attrs renders the configuration for one structured log line.
func (c Config) Attrs() []any {
	return append([]any{"driver", contract.DRADriver}, append(c.Config.Attrs(),
		"registrar_dir", c.RegistrarDir, "plugin_dir", c.PluginDir,
		"hold_resource_endpoint", c.HoldEndpoint, "kubelet_dir", c.KubeletDir, "owner_label", c.OwnerLabel, "gpu_shares", c.Shares, "mig_on_demand", c.MIGOnDemand)...)
}

// Load parses args (without the program name); a flag on the command line
// wins over its environment aliases, which win over the default. It returns
// cli.ErrHelp/cli.ErrVersion after answering those, and cli.UsageError for
// a bad command line or value.
func Load(args []string, getenv func(string) string, stdout, stderr io.Writer) (Config, error) {
	var c Config
	cmd := cli.New(Name, "[flags]", cli.WithOutput(stdout, stderr), cli.WithEnvPrefix("NVINJECT_"),
		cli.WithAbout(`nvinject's DRA kubelet plugin: publishes the node's selected NVIDIA GPUs as
devices of driver `+contract.DRADriver+` in a ResourceSlice, prepares claims with
the GPUs' names in the node's one CDI spec, and reports GPU health to kubelet
(KEP-4680) and as device taints. Run it on nodes without the device plugin.
Signals: SIGTERM/SIGINT stop it; SIGHUP clears every GPU's Xid and loss marks.`))
	node := nodeconfig.Register(cmd, nodeconfig.Defaults{
		MetricsAddr:       fmt.Sprintf(":%d", contract.DRAMetricsPort),
		StateDirUsage:     "where prepared claims are checkpointed, and the health checkpoint kept (default: <kubelet-plugins-dir>/" + contract.DRADriver + ")",
		ResourceNameUsage: "extended resource the DeviceClass's extendedResourceName serves (KEP-5004)",
		MIGStrategy:       gpuselect.MIGMixed,
		NodeNameUsage:     "the ResourceSlice's node and pool, and the Node the GPU labels are published on",
		APIAlways:         true,
	})
	fs := cmd.Flags()
	fs.StringVar(&c.RegistrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet's plugin registration directory (same path inside and outside the container)")
	fs.StringVar(&c.PluginDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "kubelet's plugins directory; the driver's dra.sock goes in <dir>/"+contract.DRADriver)
	fs.BoolVar(&c.HoldEndpoint, "hold-resource-endpoint", true, "register an empty device-plugin endpoint for --resource-name in --kubelet-dir: capacity 0 at once after a switch, and Kubernetes 1.37's device manager keeps serving the resource's DRA containers (dra/README.md)")
	fs.StringVar(&c.KubeletDir, "kubelet-dir", "/var/lib/kubelet/device-plugins", "kubelet's device plugin directory (holds kubelet.sock), for --hold-resource-endpoint")
	fs.StringVar(&c.OwnerLabel, "owner-label", "", "node label the DaemonSet selects by (value "+contract.DRAModeDRA+", e.g. "+contract.DRAModeLabel+"): stopping on a node whose label no longer says so, nvinject-dra deletes its ResourceSlices at once; empty keeps them (kubelet wipes them 30 s after the plugin is gone)")
	fs.BoolVar(&c.Shares, "gpu-shares", false, "also publish each GPU without MIG as a share device (gpu-<index>-share, DeviceClass "+contract.DRAShareClass+"): claims consume part of its memory and computePercent (KEP-5075 consumable capacity), each enforced by its own MPS daemon; needs --mps-dir and the API server's DRAConsumableCapacity and DRAPartitionableDevices gates")
	fs.BoolVar(&c.MIGOnDemand, "mig-on-demand", false, "publish each GPU with MIG mode on and no MIG device as its placements (one device per placement of each profile, KEP-4815 counters keep them apart) and make a claim's MIG device at prepare through NVML, destroying it at unprepare; needs the API server's DRAPartitionableDevices gate")
	if err := cmd.Parse(args, getenv); err != nil {
		return Config{}, err
	}
	if len(cmd.Args()) > 0 {
		return Config{}, cli.Usagef("unexpected arguments %s; configuration is given by flags and environment only (see %s --help)", contract.List(cmd.Args()), Name)
	}
	errs := node.Validate()
	c.Config = *node
	if c.HoldEndpoint && !filepath.IsAbs(c.KubeletDir) {
		errs = append(errs, fmt.Errorf("--kubelet-dir=%s is not an absolute path; give kubelet's device plugin directory, or --hold-resource-endpoint=false", contract.Quote(c.KubeletDir)))
	}
	for flagName, dir := range map[string]string{"--kubelet-registrar-dir": c.RegistrarDir, "--kubelet-plugins-dir": c.PluginDir} {
		if !filepath.IsAbs(dir) {
			errs = append(errs, fmt.Errorf("%s=%s is not an absolute path; kubelet needs the host path", flagName, contract.Quote(dir)))
		}
	}
	if c.Shares && c.MPSDir == "" {
		errs = append(errs, errors.New("--gpu-shares needs --mps-dir: each share is enforced by its own MPS daemon"))
	}
	if c.StateDir == "" {
		c.StateDir = c.DriverPluginDir()
	}
	// The socket path must fit a unix socket address (108 bytes with NUL).
	if n := len(filepath.Join(c.DriverPluginDir(), "dra.sock")); n > 107 {
		errs = append(errs, fmt.Errorf("--kubelet-plugins-dir=%s makes a %d-byte socket path; unix sockets allow 107", contract.Quote(c.PluginDir), n))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, cli.UsageError{Err: contract.Bound(err)}
	}
	return c, nil
}

// DriverPluginDir is the driver's own directory under kubelet's plugins
// directory (dra.sock lives there).
func (c Config) DriverPluginDir() string { return filepath.Join(c.PluginDir, contract.DRADriver) }

// ErrHelp reports whether err ended a run that only answered --help or --version.
func ErrHelp(err error) bool { return errors.Is(err, flag.ErrHelp) || errors.Is(err, cli.ErrVersion) }
