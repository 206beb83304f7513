// Package config reads the device plugin's configuration from flags and
// their environment aliases (the seed's NVIDIA_VISIBLE_DEVICES, MIG_STRATEGY,
// DEVICE_LIST_STRATEGY, DEVICE_ID_STRATEGY, then NVINJECT_<FLAG>). It is the only place the
// plugin reads the environment.
package config

import (
	"errors"
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
	"github.com/nvinject/nvinject/shared/logging"
	"github.com/nvinject/nvinject/shared/version"
)

// IDStrategy says which device IDs kubelet sees.
type IDStrategy string

// Device ID strategies.
const (
	IDUUID  IDStrategy = "uuid"
	IDIndex IDStrategy = "index"
)

// On NVML failure at start: exit, or keep retrying while /readyz says why.
const (
	OnNVMLErrorExit = "exit"
	OnNVMLErrorWait = "wait"
)

// Config is the plugin's effective configuration.
type Config struct {
	NVML       string
	DriverRoot string
	// HostDriverRoot is DriverRoot's path on the host; CDI specs name host paths.
	HostDriverRoot string
	// HookBinary is the host path of the hook program the CDI spec's
	// createContainer hooks run; empty for a spec without hooks.
	HookBinary       string
	KubeletDir       string
	PluginSocket     string
	ResourceName     string
	CDISpecDir       string
	StateDir         string
	CDIVendor        string
	CDIClass         string
	AnnotationPrefix string
	Strategies       []contract.Strategy
	IDStrategy       IDStrategy
	VisibleDevices   string
	Selector         gpuselect.Selector
	MIGStrategy      gpuselect.MIGStrategy
	MetricsAddr      string
	IgnoredXids      []uint64
	QuietPeriod      time.Duration
	OnNVMLError      string
	// PodResourcesSocket is kubelet's PodResources socket, from which the
	// GPUs DRA claims hold are read; empty disables it.
	PodResourcesSocket string
	LogFormat          string
	LogLevel           string
}

// KubeletSocket is the kubelet's registration socket.
func (c Config) KubeletSocket() string { return filepath.Join(c.KubeletDir, "kubelet.sock") }

// Attrs renders the configuration for one structured log line.
func (c Config) Attrs() []any {
	strs := strategyNames(c.Strategies)
	xids := make([]string, len(c.IgnoredXids))
	for i, x := range c.IgnoredXids {
		xids[i] = strconv.FormatUint(x, 10)
	}
	return []any{
		"version", version.Version, "revision", version.Rev(),
		"nvml", c.NVML, "driver_root", c.DriverRoot, "host_driver_root", c.HostDriverRoot, "hook_binary", c.HookBinary, "kubelet_dir", c.KubeletDir,
		"plugin_socket", c.PluginSocket, "resource_name", c.ResourceName,
		"cdi_spec_dir", c.CDISpecDir, "state_dir", c.StateDir, "cdi_kind", c.CDIVendor + "/" + c.CDIClass,
		"cdi_annotation_prefix", c.AnnotationPrefix,
		"device_list_strategy", strings.Join(strs, ","), "device_id_strategy", string(c.IDStrategy),
		"visible_devices", c.VisibleDevices, "mig_strategy", string(c.MIGStrategy),
		"metrics_addr", c.MetricsAddr, "ignored_xids", strings.Join(xids, ","),
		"health_quiet_period", c.QuietPeriod.String(), "on_nvml_error", c.OnNVMLError,
		"pod_resources_socket", c.PodResourcesSocket,
	}
}

// Load parses args (without the program name), help to stdout and
// warnings to stderr. A flag given on the command line wins over its
// environment alias (the seed's name, then NVINJECT_<FLAG>), which wins over
// the default.
func Load(args []string, getenv func(string) string, stdout, stderr io.Writer) (Config, error) {
	var c Config
	var strategies, idStrategy, mig, xids string
	var logFlags logging.Flags
	cmd := cli.New("nvinject-device-plugin", "[flags]", cli.WithOutput(stdout, stderr), cli.WithEnvPrefix("NVINJECT_"),
		cli.WithAbout("Publishes the node's selected NVIDIA GPUs to kubelet as an extended resource and answers Allocate with CDI device names only. SIGHUP clears every GPU's Xid and loss marks."))
	fs := cmd.Flags()
	fs.StringVar(&c.NVML, "nvml", backend.Real, "GPU source: real, or sim:a100-80gb[*N] for a SIMULATED node")
	fs.StringVar(&c.DriverRoot, "driver-root", "/", "where the NVIDIA driver's files are, as this process sees them")
	fs.StringVar(&c.HostDriverRoot, "host-driver-root", "", "the driver root's path on the host, which the CDI spec's mounts name (default: --driver-root)")
	fs.StringVar(&c.HookBinary, "hook-binary", "", nodeconfig.HookBinaryUsage)
	fs.StringVar(&c.KubeletDir, "kubelet-dir", "/var/lib/kubelet/device-plugins", "kubelet's device plugin directory (holds kubelet.sock)")
	fs.StringVar(&c.PluginSocket, "plugin-socket", "nvinject-gpu.sock", "file name of this plugin's socket in --kubelet-dir")
	fs.StringVar(&c.ResourceName, "resource-name", contract.ResourceName, "extended resource to publish")
	fs.StringVar(&c.CDISpecDir, "cdi-spec-dir", contract.CDISpecDir, "where the CDI spec for the published GPUs is written")
	fs.StringVar(&c.StateDir, "state-dir", "/var/lib/nvinject/device-plugin", "where the health checkpoint is kept across restarts (a host directory); empty keeps health in memory only")
	fs.StringVar(&c.CDIVendor, "cdi-vendor", contract.CDIVendor, "CDI vendor of the GPU devices")
	fs.StringVar(&c.CDIClass, "cdi-class", contract.CDIClass, "CDI class of the GPU devices")
	fs.StringVar(&c.AnnotationPrefix, "cdi-annotation-prefix", contract.AnnotationPrefix, "plugin name in cdi.k8s.io/<prefix>_<device-id> annotation keys")
	fs.StringVar(&strategies, "device-list-strategy", strings.Join(strategyNames(contract.DefaultStrategies()), ","), "how Allocate passes CDI names: cdi-annotations, cdi-cri, nri (comma list)")
	fs.StringVar(&idStrategy, "device-id-strategy", string(IDUUID), "device IDs kubelet sees: uuid or index")
	fs.StringVar(&c.VisibleDevices, "visible-devices", "all", "GPUs to publish: UUIDs or indices (ConfigMap key "+contract.ConfigMapKey+"), all or none")
	fs.StringVar(&mig, "mig-strategy", string(gpuselect.MIGNone), "MIG handling: none (whole GPUs only)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", fmt.Sprintf(":%d", contract.DevicePluginMetricsPort), "address of /metrics, /healthz and /readyz; empty disables")
	fs.StringVar(&xids, "ignored-xids", nodeconfig.DefaultIgnoredXids, "Xids that do not make a GPU unhealthy (comma list, or none)")
	fs.DurationVar(&c.QuietPeriod, "health-quiet-period", 5*time.Minute, "an Xid-unhealthy GPU turns Healthy after this long without a new Xid; 0 keeps it Unhealthy until SIGHUP")
	fs.StringVar(&c.OnNVMLError, "on-nvml-error", OnNVMLErrorWait, "when NVML cannot start: exit, or wait and retry (readyz fails meanwhile)")
	nodeconfig.PodResourcesSocketFlag(fs, &c.PodResourcesSocket)
	logFlags.Register(fs, logging.JSON)
	// The seed's environment names, tried before NVINJECT_<FLAG>.
	cmd.Env("device-list-strategy", "DEVICE_LIST_STRATEGY")
	cmd.Env("device-id-strategy", "DEVICE_ID_STRATEGY")
	cmd.Env("visible-devices", contract.EnvVisibleDevices)
	cmd.Env("mig-strategy", "MIG_STRATEGY")
	if err := cmd.Parse(args, getenv); err != nil {
		return Config{}, err
	}
	if len(cmd.Args()) > 0 {
		return Config{}, cli.Usagef("unexpected arguments %q; configuration is given by flags and environment only", cmd.Args())
	}
	c.LogFormat, c.LogLevel = logFlags.Format, logFlags.Level

	var err error
	errs := []error{}
	if c.Strategies, err = contract.ParseStrategies(strategies); err != nil {
		errs = append(errs, err)
	}
	if c.IDStrategy, err = ParseIDStrategy(idStrategy); err != nil {
		errs = append(errs, err)
	}
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
			errs = append(errs, fmt.Errorf("--nvml=%q is not valid: use real, or sim:a100-80gb[*N] for a simulated node (%w)", c.NVML, err))
		}
	}
	if c.OnNVMLError != OnNVMLErrorExit && c.OnNVMLError != OnNVMLErrorWait {
		errs = append(errs, fmt.Errorf("--on-nvml-error=%q is not valid; use exit or wait", c.OnNVMLError))
	}
	if err := nodeconfig.ValidateResourceName(c.ResourceName); err != nil {
		errs = append(errs, err)
	}
	if err := parser.ValidateVendorName(c.CDIVendor); err != nil {
		errs = append(errs, fmt.Errorf("--cdi-vendor=%q: %w", c.CDIVendor, err))
	}
	if err := parser.ValidateClassName(c.CDIClass); err != nil {
		errs = append(errs, fmt.Errorf("--cdi-class=%q: %w", c.CDIClass, err))
	}
	if c.PluginSocket == "" || c.PluginSocket == "kubelet.sock" || strings.ContainsRune(c.PluginSocket, '/') {
		errs = append(errs, fmt.Errorf("--plugin-socket=%q is not valid; give a plain file name other than kubelet.sock", c.PluginSocket))
	}
	if c.KubeletDir == "" {
		errs = append(errs, errors.New("--kubelet-dir is empty; give kubelet's device plugin directory"))
	} else if n := len(filepath.Join(c.KubeletDir, c.PluginSocket)); n > 107 {
		errs = append(errs, fmt.Errorf("--kubelet-dir=%q with --plugin-socket=%q makes a %d-byte socket path; unix sockets allow 107", c.KubeletDir, c.PluginSocket, n))
	}
	if err := nodeconfig.ValidateHookBinary(c.HookBinary); err != nil {
		errs = append(errs, err)
	}
	if err := nodeconfig.ValidatePodResourcesSocket(c.PodResourcesSocket); err != nil {
		errs = append(errs, err)
	}
	if c.CDISpecDir == "" {
		errs = append(errs, errors.New("--cdi-spec-dir is empty; give the directory containerd reads CDI specs from (/var/run/cdi)"))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, cli.UsageError{Err: err}
	}
	return c, nil
}

func strategyNames(ss []contract.Strategy) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// ParseIDStrategy reads a DEVICE_ID_STRATEGY value.
func ParseIDStrategy(v string) (IDStrategy, error) {
	switch IDStrategy(v) {
	case IDUUID, IDIndex:
		return IDStrategy(v), nil
	}
	return "", fmt.Errorf("DEVICE_ID_STRATEGY=%q is not valid; use uuid or index", v)
}
