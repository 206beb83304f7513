// Package config reads the device plugin's configuration from flags and
// their environment aliases (the seed's NVIDIA_VISIBLE_DEVICES, MIG_STRATEGY,
// DEVICE_LIST_STRATEGY, DEVICE_ID_STRATEGY). It is the only place the
// plugin reads the environment.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/gpu/sim"
)

// Strategy is one way Allocate hands CDI device names to the runtime.
type Strategy string

// Device list strategies.
const (
	// StrategyAnnotations sets cdi.k8s.io/<prefix>_<id> container annotations.
	StrategyAnnotations Strategy = "cdi-annotations"
	// StrategyCRI fills the CRI CDIDevices field.
	StrategyCRI Strategy = "cdi-cri"
	// StrategyNRI sets nvinject's own annotation, read only by nvinject's NRI plugin.
	StrategyNRI Strategy = "nri"
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

// DefaultIgnoredXids are the Xids NVIDIA's device plugin treats as
// application errors (the GPU itself stays usable).
const DefaultIgnoredXids = "13,31,43,45,68,109"

// Config is the plugin's effective configuration.
type Config struct {
	NVML       string
	DriverRoot string
	// HostDriverRoot is DriverRoot's path on the host; CDI specs name host paths.
	HostDriverRoot   string
	KubeletDir       string
	PluginSocket     string
	ResourceName     string
	CDISpecDir       string
	StateDir         string
	CDIVendor        string
	CDIClass         string
	AnnotationPrefix string
	Strategies       []Strategy
	IDStrategy       IDStrategy
	VisibleDevices   string
	Selector         gpuselect.Selector
	MIGStrategy      gpuselect.MIGStrategy
	MetricsAddr      string
	IgnoredXids      []uint64
	QuietPeriod      time.Duration
	OnNVMLError      string
	LogFormat        string
	LogLevel         string
}

// KubeletSocket is the kubelet's registration socket.
func (c Config) KubeletSocket() string { return filepath.Join(c.KubeletDir, "kubelet.sock") }

// Has reports whether s is among the configured strategies.
func (c Config) Has(s Strategy) bool { return slices.Contains(c.Strategies, s) }

// Attrs renders the configuration for one structured log line.
func (c Config) Attrs() []any {
	strs := make([]string, len(c.Strategies))
	for i, s := range c.Strategies {
		strs[i] = string(s)
	}
	xids := make([]string, len(c.IgnoredXids))
	for i, x := range c.IgnoredXids {
		xids[i] = strconv.FormatUint(x, 10)
	}
	return []any{
		"nvml", c.NVML, "driver_root", c.DriverRoot, "host_driver_root", c.HostDriverRoot, "kubelet_dir", c.KubeletDir,
		"plugin_socket", c.PluginSocket, "resource_name", c.ResourceName,
		"cdi_spec_dir", c.CDISpecDir, "state_dir", c.StateDir, "cdi_kind", c.CDIVendor + "/" + c.CDIClass,
		"cdi_annotation_prefix", c.AnnotationPrefix,
		"device_list_strategy", strings.Join(strs, ","), "device_id_strategy", string(c.IDStrategy),
		"visible_devices", c.VisibleDevices, "mig_strategy", string(c.MIGStrategy),
		"metrics_addr", c.MetricsAddr, "ignored_xids", strings.Join(xids, ","),
		"health_quiet_period", c.QuietPeriod.String(), "on_nvml_error", c.OnNVMLError,
	}
}

// Load parses args (without the program name). A flag given on the command
// line wins over its environment alias, which wins over the default.
func Load(args []string, getenv func(string) string, usage io.Writer) (Config, error) {
	var c Config
	var strategies, idStrategy, mig, xids string
	fs := flag.NewFlagSet("nvinject-device-plugin", flag.ContinueOnError)
	fs.SetOutput(usage)
	env := map[string]string{}
	str := func(p *string, name, envName, def, help string) {
		env[name] = envName
		fs.StringVar(p, name, def, help+" (env "+envName+")")
	}
	str(&c.NVML, "nvml", "NVINJECT_NVML", backend.Real, "GPU source: real, or sim:a100-80gb[*N] for a SIMULATED node")
	str(&c.DriverRoot, "driver-root", "NVINJECT_DRIVER_ROOT", "/", "where the NVIDIA driver's files are, as this process sees them")
	str(&c.HostDriverRoot, "host-driver-root", "NVINJECT_HOST_DRIVER_ROOT", "", "the driver root's path on the host, which the CDI spec's mounts name (default: --driver-root)")
	str(&c.KubeletDir, "kubelet-dir", "NVINJECT_KUBELET_DIR", "/var/lib/kubelet/device-plugins", "kubelet's device plugin directory (holds kubelet.sock)")
	str(&c.PluginSocket, "plugin-socket", "NVINJECT_PLUGIN_SOCKET", "nvinject-gpu.sock", "file name of this plugin's socket in --kubelet-dir")
	str(&c.ResourceName, "resource-name", "NVINJECT_RESOURCE_NAME", "nvidia.com/gpu", "extended resource to publish")
	str(&c.CDISpecDir, "cdi-spec-dir", "NVINJECT_CDI_SPEC_DIR", "/var/run/cdi", "where the CDI spec for the published GPUs is written")
	str(&c.StateDir, "state-dir", "NVINJECT_STATE_DIR", "/var/lib/nvinject/device-plugin", "where the health checkpoint is kept across restarts (a host directory); empty keeps health in memory only")
	str(&c.CDIVendor, "cdi-vendor", "NVINJECT_CDI_VENDOR", "nvidia.com", "CDI vendor of the GPU devices")
	str(&c.CDIClass, "cdi-class", "NVINJECT_CDI_CLASS", "gpu", "CDI class of the GPU devices")
	str(&c.AnnotationPrefix, "cdi-annotation-prefix", "NVINJECT_CDI_ANNOTATION_PREFIX", "nvinject.gpu", "plugin name in cdi.k8s.io/<prefix>_<device-id> annotation keys")
	str(&strategies, "device-list-strategy", "DEVICE_LIST_STRATEGY", "cdi-annotations,cdi-cri", "how Allocate passes CDI names: cdi-annotations, cdi-cri, nri (comma list)")
	str(&idStrategy, "device-id-strategy", "DEVICE_ID_STRATEGY", string(IDUUID), "device IDs kubelet sees: uuid or index")
	str(&c.VisibleDevices, "visible-devices", "NVIDIA_VISIBLE_DEVICES", "all", "GPUs to publish: UUIDs or indices (ConfigMap key selected-gpu-uuid), all or none")
	str(&mig, "mig-strategy", "MIG_STRATEGY", string(gpuselect.MIGNone), "MIG handling: none (whole GPUs only)")
	str(&c.MetricsAddr, "metrics-addr", "NVINJECT_METRICS_ADDR", ":9481", "address of /metrics, /healthz and /readyz; empty disables")
	str(&xids, "ignored-xids", "NVINJECT_IGNORED_XIDS", DefaultIgnoredXids, "Xids that do not make a GPU unhealthy (comma list, or none)")
	var quiet string
	str(&quiet, "health-quiet-period", "NVINJECT_HEALTH_QUIET_PERIOD", "5m", "an Xid-unhealthy GPU turns Healthy after this long without a new Xid; 0 keeps it Unhealthy until SIGHUP")
	str(&c.OnNVMLError, "on-nvml-error", "NVINJECT_ON_NVML_ERROR", OnNVMLErrorWait, "when NVML cannot start: exit, or wait and retry (readyz fails meanwhile)")
	str(&c.LogFormat, "log-format", "NVINJECT_LOG_FORMAT", "text", "log format: text or json")
	str(&c.LogLevel, "log-level", "NVINJECT_LOG_LEVEL", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q; configuration is given by flags and environment only", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, envName := range env {
		if v := getenv(envName); v != "" && !set[name] {
			if err := fs.Set(name, v); err != nil {
				return Config{}, fmt.Errorf("%s=%q: %w", envName, v, err)
			}
		}
	}

	var err error
	errs := []error{}
	if c.Strategies, err = ParseStrategies(strategies); err != nil {
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
	if c.IgnoredXids, err = ParseXids(xids); err != nil {
		errs = append(errs, err)
	}
	if c.QuietPeriod, err = time.ParseDuration(quiet); err != nil || c.QuietPeriod < 0 {
		errs = append(errs, fmt.Errorf("--health-quiet-period=%q is not valid; give a duration such as 5m, or 0 to recover only on SIGHUP", quiet))
	}
	if c.NVML != backend.Real {
		if _, err := sim.ParseSpec(c.NVML); err != nil {
			errs = append(errs, fmt.Errorf("--nvml=%q is not valid: use real, or sim:a100-80gb[*N] for a simulated node (%w)", c.NVML, err))
		}
	}
	if c.OnNVMLError != OnNVMLErrorExit && c.OnNVMLError != OnNVMLErrorWait {
		errs = append(errs, fmt.Errorf("--on-nvml-error=%q is not valid; use exit or wait", c.OnNVMLError))
	}
	if err := validateResourceName(c.ResourceName); err != nil {
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
	if c.CDISpecDir == "" {
		errs = append(errs, errors.New("--cdi-spec-dir is empty; give the directory containerd reads CDI specs from (/var/run/cdi)"))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// ParseStrategies reads a DEVICE_LIST_STRATEGY value.
func ParseStrategies(v string) ([]Strategy, error) {
	var out []Strategy
	for _, f := range strings.Split(v, ",") {
		s := Strategy(strings.TrimSpace(f))
		switch s {
		case StrategyAnnotations, StrategyCRI, StrategyNRI:
		case "envvar", "volume-mounts":
			return nil, fmt.Errorf("DEVICE_LIST_STRATEGY=%q: %q is not supported; nvinject hands out CDI names only: use cdi-annotations, cdi-cri and/or nri", v, s)
		default:
			return nil, fmt.Errorf("DEVICE_LIST_STRATEGY=%q: %q is not a strategy; use cdi-annotations, cdi-cri and/or nri, comma-separated", v, s)
		}
		if slices.Contains(out, s) {
			return nil, fmt.Errorf("DEVICE_LIST_STRATEGY=%q names %q twice", v, s)
		}
		out = append(out, s)
	}
	return out, nil
}

// ParseIDStrategy reads a DEVICE_ID_STRATEGY value.
func ParseIDStrategy(v string) (IDStrategy, error) {
	switch IDStrategy(v) {
	case IDUUID, IDIndex:
		return IDStrategy(v), nil
	}
	return "", fmt.Errorf("DEVICE_ID_STRATEGY=%q is not valid; use uuid or index", v)
}

// ParseXids reads a comma list of Xid numbers; "none" or "" is the empty list.
func ParseXids(v string) ([]uint64, error) {
	v = strings.TrimSpace(v)
	if v == "" || v == "none" {
		return nil, nil
	}
	var out []uint64
	for _, f := range strings.Split(v, ",") {
		x, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--ignored-xids=%q: %q is not an Xid number; give a comma list such as %s, or none", v, f, DefaultIgnoredXids)
		}
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out, nil
}

func validateResourceName(r string) error {
	domain, name, ok := strings.Cut(r, "/")
	if !ok || domain == "" || name == "" || strings.Contains(name, "/") || strings.HasPrefix(domain, "kubernetes.io") || !strings.Contains(domain, ".") {
		return fmt.Errorf("--resource-name=%q is not a valid extended resource; use <domain>/<name> such as nvidia.com/gpu", r)
	}
	return nil
}
