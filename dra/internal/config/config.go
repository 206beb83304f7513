// Package config reads nvinject-dra's configuration from flags and their
// environment aliases (shared/cli: NVINJECT_<FLAG>, plus the seed's
// NVIDIA_VISIBLE_DEVICES and MIG_STRATEGY, and NODE_NAME/KUBECONFIG). It is
// the only place the DRA driver reads the environment.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nvinject/nvinject/gpunode/nodeconfig"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// Name is the program name.
const Name = "nvinject-dra"

// Config is nvinject-dra's effective configuration.
type Config struct {
	NVML           string
	DriverRoot     string
	HostDriverRoot string
	CDISpecDir     string
	HookBinary     string
	CDIVendor      string
	CDIClass       string
	VisibleDevices string
	Selector       gpuselect.Selector
	MIGStrategy    gpuselect.MIGStrategy
	IgnoredXids    []uint64
	QuietPeriod    time.Duration

	NodeName string
	// Kubeconfig is empty for the in-cluster configuration.
	Kubeconfig string
	// RegistrarDir is kubelet's plugins_registry; PluginDir holds dra.sock.
	RegistrarDir string
	PluginDir    string
	StateDir     string
	// ResourceName is the extended resource the DeviceClass serves; with
	// HoldEndpoint an empty device-plugin endpoint for it is registered in
	// KubeletDir (deviceplugin/endpoint says why).
	ResourceName string
	HoldEndpoint bool
	KubeletDir   string
	// PodResourcesSocket is kubelet's PodResources socket, from which the
	// GPUs device-plugin pods still hold are read; empty disables it.
	PodResourcesSocket string
	// OwnerLabel is the node label deploy/ selects nvinject-dra by (value
	// dra); empty when it runs on every node.
	OwnerLabel string

	MetricsAddr string
	LogFormat   string
	LogLevel    string
}

// Attrs renders the configuration for one structured log line.
func (c Config) Attrs() []any {
	xids := make([]string, len(c.IgnoredXids))
	for i, x := range c.IgnoredXids {
		xids[i] = strconv.FormatUint(x, 10)
	}
	kube := c.Kubeconfig
	if kube == "" {
		kube = "in-cluster"
	}
	return []any{
		"driver", contract.DRADriver, "node_name", c.NodeName, "kubeconfig", kube,
		"nvml", c.NVML, "driver_root", c.DriverRoot, "host_driver_root", c.HostDriverRoot,
		"cdi_spec_dir", c.CDISpecDir, "hook_binary", c.HookBinary, "cdi_kind", contract.CDIKind(c.CDIVendor, c.CDIClass),
		"visible_devices", c.VisibleDevices, "mig_strategy", string(c.MIGStrategy),
		"ignored_xids", strings.Join(xids, ","), "health_quiet_period", c.QuietPeriod.String(),
		"registrar_dir", c.RegistrarDir, "plugin_dir", c.PluginDir, "state_dir", c.StateDir,
		"resource_name", c.ResourceName, "hold_resource_endpoint", c.HoldEndpoint, "kubelet_dir", c.KubeletDir, "pod_resources_socket", c.PodResourcesSocket, "owner_label", c.OwnerLabel,
		"metrics_addr", c.MetricsAddr,
	}
}

// Load parses args (without the program name); a flag on the command line
// wins over its environment aliases, which win over the default. It returns
// cli.ErrHelp/cli.ErrVersion after answering those, and cli.UsageError for
// a bad command line or value.
func Load(args []string, getenv func(string) string, stdout, stderr io.Writer) (Config, error) {
	var c Config
	var mig, xids string
	cmd := cli.New(Name, "[flags]", cli.WithOutput(stdout, stderr), cli.WithEnvPrefix("NVINJECT_"),
		cli.WithAbout(`nvinject's DRA kubelet plugin: publishes the node's selected NVIDIA GPUs as
devices of driver `+contract.DRADriver+` in a ResourceSlice, prepares claims with
the GPUs' names in the node's one CDI spec, and reports GPU health to kubelet
(KEP-4680) and as device taints. Run it on nodes without the device plugin.
Signals: SIGTERM/SIGINT stop it; SIGHUP clears every GPU's Xid and loss marks.`))
	fs := cmd.Flags()
	fs.StringVar(&c.NVML, "nvml", backend.Real, "GPU source: real, or sim:a100-80gb[*N] for a SIMULATED node")
	fs.StringVar(&c.DriverRoot, "driver-root", "/", "where the NVIDIA driver's files are, as this process sees them")
	fs.StringVar(&c.HostDriverRoot, "host-driver-root", "", "the driver root's path on the host, which the CDI spec's mounts name (default: --driver-root)")
	fs.StringVar(&c.CDISpecDir, "cdi-spec-dir", contract.CDISpecDir, "where the node's CDI spec for the published GPUs is written")
	fs.StringVar(&c.HookBinary, "hook-binary", "", nodeconfig.HookBinaryUsage)
	fs.StringVar(&c.CDIVendor, "cdi-vendor", contract.CDIVendor, "CDI vendor of the GPU devices")
	fs.StringVar(&c.CDIClass, "cdi-class", contract.CDIClass, "CDI class of the GPU devices")
	fs.StringVar(&c.VisibleDevices, "visible-devices", "all", "GPUs to publish: UUIDs or indices (ConfigMap key "+contract.ConfigMapKey+"), all or none")
	cmd.Env("visible-devices", contract.EnvVisibleDevices)
	fs.StringVar(&mig, "mig-strategy", string(gpuselect.MIGNone), "MIG handling: none (whole GPUs only)")
	cmd.Env("mig-strategy", "MIG_STRATEGY")
	fs.StringVar(&xids, "ignored-xids", nodeconfig.DefaultIgnoredXids, "Xids that do not make a GPU unhealthy (comma list, or none)")
	fs.DurationVar(&c.QuietPeriod, "health-quiet-period", 5*time.Minute, "an Xid-unhealthy GPU turns Healthy after this long without a new Xid; 0 keeps it Unhealthy until SIGHUP")
	fs.StringVar(&c.NodeName, "node-name", "", "this node's name (the ResourceSlice's node and pool); set NODE_NAME from the downward API")
	cmd.Env("node-name", "NODE_NAME")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig for the API server; empty: in-cluster service account (KUBERNETES_SERVICE_HOST/PORT)")
	cmd.Env("kubeconfig", "KUBECONFIG")
	fs.StringVar(&c.RegistrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet's plugin registration directory (same path inside and outside the container)")
	fs.StringVar(&c.PluginDir, "kubelet-plugins-dir", "/var/lib/kubelet/plugins", "kubelet's plugins directory; the driver's dra.sock goes in <dir>/"+contract.DRADriver)
	fs.StringVar(&c.StateDir, "state-dir", "", "where prepared claims are checkpointed (default: <kubelet-plugins-dir>/"+contract.DRADriver+")")
	fs.StringVar(&c.ResourceName, "resource-name", contract.ResourceName, "extended resource the DeviceClass's extendedResourceName serves (KEP-5004)")
	fs.BoolVar(&c.HoldEndpoint, "hold-resource-endpoint", true, "register an empty device-plugin endpoint for --resource-name in --kubelet-dir: capacity 0 at once after a switch, and Kubernetes 1.37's device manager keeps serving the resource's DRA containers (dra/README.md)")
	fs.StringVar(&c.KubeletDir, "kubelet-dir", "/var/lib/kubelet/device-plugins", "kubelet's device plugin directory (holds kubelet.sock), for --hold-resource-endpoint")
	nodeconfig.PodResourcesSocketFlag(fs, &c.PodResourcesSocket)
	fs.StringVar(&c.OwnerLabel, "owner-label", "", "node label the DaemonSet selects by (value "+contract.DRAModeDRA+", e.g. "+contract.DRAModeLabel+"): stopping on a node whose label no longer says so, nvinject-dra deletes its ResourceSlices at once; empty keeps them (kubelet wipes them 30 s after the plugin is gone)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", fmt.Sprintf(":%d", contract.DRAMetricsPort), "address of /metrics, /healthz and /readyz; empty disables")
	fs.StringVar(&c.LogFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	if err := cmd.Parse(args, getenv); err != nil {
		return Config{}, err
	}
	if len(cmd.Args()) > 0 {
		return Config{}, cli.Usagef("unexpected arguments %s; configuration is given by flags and environment only (see %s --help)", contract.List(cmd.Args()), Name)
	}
	var errs []error
	var err error
	if c.Selector, err = gpuselect.Parse(c.VisibleDevices); err != nil {
		errs = append(errs, fmt.Errorf("NVIDIA_VISIBLE_DEVICES / --visible-devices: %w", err))
	}
	if c.MIGStrategy, err = gpuselect.ParseMIGStrategy(mig); err != nil {
		errs = append(errs, err)
	}
	if c.IgnoredXids, err = nodeconfig.ParseXids(xids); err != nil {
		errs = append(errs, err)
	}
	if c.QuietPeriod < 0 {
		errs = append(errs, fmt.Errorf("--health-quiet-period=%s is negative; give a duration such as 5m, or 0 to recover only on SIGHUP", c.QuietPeriod))
	}
	if c.NVML != backend.Real {
		if _, err := sim.ParseSpec(c.NVML); err != nil {
			errs = append(errs, fmt.Errorf("--nvml=%s is not valid: use real, or sim:a100-80gb[*N] for a simulated node (%w)", contract.Quote(c.NVML), err))
		}
	}
	if err := parser.ValidateVendorName(c.CDIVendor); err != nil {
		errs = append(errs, fmt.Errorf("--cdi-vendor=%s: %w", contract.Quote(c.CDIVendor), err))
	}
	if err := parser.ValidateClassName(c.CDIClass); err != nil {
		errs = append(errs, fmt.Errorf("--cdi-class=%s: %w", contract.Quote(c.CDIClass), err))
	}
	if err := nodeconfig.ValidateHookBinary(c.HookBinary); err != nil {
		errs = append(errs, err)
	}
	if c.HoldEndpoint {
		if err := nodeconfig.ValidateResourceName(c.ResourceName); err != nil {
			errs = append(errs, err)
		}
		if !filepath.IsAbs(c.KubeletDir) {
			errs = append(errs, fmt.Errorf("--kubelet-dir=%s is not an absolute path; give kubelet's device plugin directory, or --hold-resource-endpoint=false", contract.Quote(c.KubeletDir)))
		}
	}
	if err := nodeconfig.ValidatePodResourcesSocket(c.PodResourcesSocket); err != nil {
		errs = append(errs, err)
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("--node-name is empty; set NODE_NAME from the downward API (fieldRef spec.nodeName)"))
	}
	for flagName, dir := range map[string]string{"--cdi-spec-dir": c.CDISpecDir, "--kubelet-registrar-dir": c.RegistrarDir, "--kubelet-plugins-dir": c.PluginDir} {
		if !filepath.IsAbs(dir) {
			errs = append(errs, fmt.Errorf("%s=%s is not an absolute path; kubelet and containerd need the host path", flagName, contract.Quote(dir)))
		}
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
