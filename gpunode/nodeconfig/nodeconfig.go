// Package nodeconfig is the one flag group both kubelet plugins register:
// the settings of the GPU node they serve (NVML, the driver root, the CDI
// spec, GPU selection, health policy, the PodResources socket, metrics,
// logging), each declared, documented and checked once.
package nodeconfig

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/driverroot"
	"github.com/nvinject/nvinject/shared/gpu/backend"
	"github.com/nvinject/nvinject/shared/gpu/gpuselect"
	"github.com/nvinject/nvinject/shared/logging"
	"github.com/nvinject/nvinject/shared/version"
)

// On NVML failure at start: exit, or keep retrying while /readyz says why.
const (
	OnNVMLErrorExit = "exit"
	OnNVMLErrorWait = "wait"
)

// DefaultIgnoredXids are the Xids NVIDIA's device plugin treats as
// application errors (the GPU itself stays usable).
const DefaultIgnoredXids = "13,31,43,45,68,109"

// DefaultMIGRescan is --mig-rescan-interval's default: a handful of NVML
// calls per GPU each time.
const DefaultMIGRescan = 10 * time.Second

// DefaultDriverCheck is --driver-check-interval's default: a few stats of
// the driver root's library links.
const DefaultDriverCheck = 5 * time.Second

// DefaultHealthUpdate is --health-update-interval's default: each report
// of a change costs the API server a write (kubelet's Node status after a
// device list, a ResourceSlice update), so a GPU flapping at 1 Hz on 1 % of
// a 5,000-node fleet is 50 writes a second; one a second per node keeps a
// single Xid immediate and a flap to at most one write per second.
const DefaultHealthUpdate = time.Second

// DefaultPodResourcesSocket is kubelet's PodResources socket.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Config is the GPU node's settings, valid once Validate returned no error.
type Config struct {
	NVML       string
	DriverRoot string
	// HostDriverRoot is DriverRoot's path on the host; CDI specs name host paths.
	HostDriverRoot string
	// DevRoot is the directory whose dev/ holds the GPUs' device nodes;
	// empty: DriverRoot when it is a system root, else /.
	DevRoot string
	// HookBinary is the host path of the hook program the CDI spec's
	// createContainer hooks run; empty for a spec without hooks.
	HookBinary     string
	CDISpecDir     string
	CDIVendor      string
	CDIClass       string
	VisibleDevices string
	Selector       gpuselect.Selector
	MIGStrategy    gpuselect.MIGStrategy
	IgnoredXids    []uint64
	QuietPeriod    time.Duration
	// HealthUpdate is the least time between two health reports to the API
	// server (the device list, the ResourceSlice taints); 0 reports every
	// change at once.
	HealthUpdate time.Duration
	// MIGRescan is how often the MIG layout is read again for a republish;
	// 0 reads it only at start and on SIGHUP.
	MIGRescan time.Duration
	// DriverCheck is how often the driver root's version is compared with
	// the spec's; 0 never.
	DriverCheck time.Duration
	OnNVMLError string
	// ResourceName is the extended resource nvidia.com/gpu: what the device
	// plugin publishes and nvinject-dra's DeviceClass serves.
	ResourceName string
	// PodResourcesSocket is kubelet's PodResources socket, from which the
	// GPUs the other path's pods hold are read; empty disables it.
	PodResourcesSocket string
	// StateDir keeps the health checkpoint (health.json); empty keeps
	// health in memory only.
	StateDir    string
	MetricsAddr string
	Log         logging.Flags
	// MPSDir is where the node runs MPS control daemons (their pipe, log
	// and shm directories); HostMPSDir is that directory on the host, which
	// the CDI specs mount into their clients.
	MPSDir, HostMPSDir string
	// NodeName is this node's Node; Kubeconfig the API server's
	// configuration, empty for the in-cluster service account.
	NodeName   string
	Kubeconfig string
	// NodeLabels publishes the GPU labels (GFD's names) on NodeName.
	NodeLabels bool

	mig, xids string
	warnings  []string
	// apiAlways: the binary needs the API server whatever --node-labels says.
	apiAlways bool
}

// Defaults are what the two binaries declare differently.
type Defaults struct {
	MetricsAddr       string
	StateDir          string
	StateDirUsage     string
	ResourceNameUsage string
	// NodeNameUsage says what else --node-name is for; APIAlways that the
	// binary reaches the API server even with --node-labels=false
	// (nvinject-dra: its ResourceSlices).
	NodeNameUsage string
	APIAlways     bool
	// MIGStrategy is --mig-strategy's default (empty: none). nvinject-dra
	// publishes MIG devices by default (mixed): a claim picks a profile by
	// its attributes, so there is no resource naming to choose.
	MIGStrategy gpuselect.MIGStrategy
}

// Register declares the group's flags and environment aliases on cmd;
// call Validate once cmd parsed them.
func Register(cmd *cli.Command, d Defaults) *Config {
	c := &Config{}
	fs := cmd.Flags()
	fs.StringVar(&c.NVML, "nvml", backend.Real, "GPU source: real, or sim:a100-80gb[*N] for a SIMULATED node")
	fs.StringVar(&c.DriverRoot, "driver-root", "/", "where the NVIDIA driver's files are, as this process sees them")
	fs.StringVar(&c.HostDriverRoot, "host-driver-root", "", "the driver root's path on the host, which the CDI spec's mounts name (default: --driver-root)")
	fs.StringVar(&c.DevRoot, "dev-root", "", "the directory whose dev/ holds the GPUs' device nodes, as this process sees it (default: --driver-root when it is a whole system root, with usr/bin or usr/lib; else /, as for a driver directory such as /home/kubernetes/bin/nvidia)")
	fs.StringVar(&c.HookBinary, "hook-binary", "", "host path of the CDI hook program (nvinject-cdi-hook, or NVIDIA's nvidia-cdi-hook) the spec's createContainer hooks run: library links, CUDA forward compatibility, ld.so.cache update; empty: no hooks")
	fs.StringVar(&c.CDISpecDir, "cdi-spec-dir", contract.CDISpecDir, "where the node's CDI spec for the published GPUs is written")
	fs.StringVar(&c.CDIVendor, "cdi-vendor", contract.CDIVendor, "CDI vendor of the GPU devices")
	fs.StringVar(&c.CDIClass, "cdi-class", contract.CDIClass, "CDI class of the GPU devices")
	fs.StringVar(&c.VisibleDevices, "visible-devices", "all", "GPUs to publish: UUIDs or indices (ConfigMap key "+contract.ConfigMapKey+"), all or none")
	mig := cmp.Or(d.MIGStrategy, gpuselect.MIGNone)
	fs.StringVar(&c.mig, "mig-strategy", string(mig), "MIG handling, NVIDIA's strategies: none (whole GPUs; MIG GPUs left out), single (every GPU MIG, one profile, published as the GPU resource), mixed (whole GPUs, and a nvidia.com/mig-<profile> resource per MIG profile); nvinject-dra publishes each MIG device under single or mixed")
	fs.StringVar(&c.xids, "ignored-xids", DefaultIgnoredXids, "Xids that do not make a GPU unhealthy (comma list, or none)")
	fs.DurationVar(&c.QuietPeriod, "health-quiet-period", 5*time.Minute, "an Xid-unhealthy GPU turns Healthy after this long without a new Xid; 0 keeps it Unhealthy until SIGHUP")
	fs.DurationVar(&c.HealthUpdate, "health-update-interval", DefaultHealthUpdate, "least time between two reports of the GPUs' health to kubelet's device list or the ResourceSlice (each an API server write): the first change after a quiet interval goes out at once, later ones within it are coalesced into the newest, sent when it ends; 0 sends every change at once")
	fs.DurationVar(&c.MIGRescan, "mig-rescan-interval", DefaultMIGRescan, "how often the MIG layout (MIG mode, MIG devices) is read again: a changed published set is republished (CDI spec, then kubelet) without a restart; SIGHUP also reads it; 0 reads it only at start and on SIGHUP")
	fs.DurationVar(&c.DriverCheck, "driver-check-interval", DefaultDriverCheck, "how often the driver root's driver version is read: once it differs from the one the CDI spec was made for (a driver upgrade), readyz says so, the stale spec is removed and the daemon exits for the DaemonSet to restart it on the new driver; 0 never checks")
	fs.StringVar(&c.OnNVMLError, "on-nvml-error", OnNVMLErrorWait, "when NVML cannot start: exit, or wait and retry (readyz fails meanwhile)")
	fs.StringVar(&c.ResourceName, "resource-name", contract.ResourceName, d.ResourceNameUsage)
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", DefaultPodResourcesSocket, "kubelet's PodResources socket, polled every second: a GPU that a pod got through the other path (device plugin or DRA) is not handed out until that pod ends, and while the socket cannot be read no GPU is (fail closed); empty disables, leaving GPUs the other path holds unprotected")
	fs.StringVar(&c.StateDir, "state-dir", d.StateDir, d.StateDirUsage)
	fs.StringVar(&c.MetricsAddr, "metrics-addr", d.MetricsAddr, "address of /metrics, /healthz and /readyz; empty disables")
	fs.StringVar(&c.MPSDir, "mps-dir", contract.MPSDir, "directory of the MPS control daemons of GPUs shared through MPS")
	fs.StringVar(&c.HostMPSDir, "host-mps-dir", "", "the --mps-dir directory's path on the host, which the CDI specs mount into MPS clients (default: --mps-dir)")
	fs.StringVar(&c.NodeName, "node-name", "", "this node's Node name: "+cmp.Or(d.NodeNameUsage, "the Node the GPU labels are published on")+"; set NODE_NAME from the downward API")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig for the API server; empty: in-cluster service account (KUBERNETES_SERVICE_HOST/PORT)")
	fs.BoolVar(&c.NodeLabels, "node-labels", true, "publish the node's GPU labels in NVIDIA GPU feature discovery's names (nvidia.com/gpu.product, gpu.memory, gpu.count, cuda.driver-version.full, ...) on --node-name by server-side apply, again at every MIG republish; needs get and patch on nodes")
	c.apiAlways = d.APIAlways
	c.Log.Register(fs, logging.JSON)
	// NVIDIA's device plugin's environment names, tried before NVINJECT_<FLAG>.
	cmd.Env("visible-devices", contract.EnvVisibleDevices)
	cmd.Env("mig-strategy", "MIG_STRATEGY")
	cmd.Env("node-name", "NODE_NAME")
	cmd.Env("kubeconfig", "KUBECONFIG")
	return c
}

// Validate checks the parsed values and fills Selector, MIGStrategy and
// IgnoredXids. It returns every problem, for the binary to report with its
// own as one usage error.
func (c *Config) Validate() []error {
	var errs []error
	var err error
	c.HostMPSDir = cmp.Or(c.HostMPSDir, c.MPSDir)
	for _, f := range [][2]string{{"mps-dir", c.MPSDir}, {"host-mps-dir", c.HostMPSDir}} {
		if !filepath.IsAbs(f[1]) {
			errs = append(errs, fmt.Errorf("--%s=%q is not an absolute path; give the directory for MPS daemons, such as %s", f[0], f[1], contract.MPSDir))
		}
	}
	if c.Selector, err = gpuselect.Parse(c.VisibleDevices); err != nil {
		errs = append(errs, fmt.Errorf("NVIDIA_VISIBLE_DEVICES / --visible-devices: %w", err))
	}
	if c.MIGStrategy, err = gpuselect.ParseMIGStrategy(c.mig); err != nil {
		errs = append(errs, err)
	}
	if c.IgnoredXids, err = ParseXids(c.xids); err != nil {
		errs = append(errs, err)
	}
	if c.QuietPeriod < 0 {
		errs = append(errs, fmt.Errorf("--health-quiet-period=%s is negative; give a duration such as 5m, or 0 to recover only on SIGHUP", c.QuietPeriod))
	}
	if c.HealthUpdate < 0 {
		errs = append(errs, fmt.Errorf("--health-update-interval=%s is negative; give a duration such as 1s, or 0 to report every health change at once", c.HealthUpdate))
	}
	if c.DriverCheck < 0 {
		errs = append(errs, fmt.Errorf("--driver-check-interval=%s is negative; give a duration such as 5s, or 0 not to follow driver upgrades", c.DriverCheck))
	}
	if c.MIGRescan < 0 {
		errs = append(errs, fmt.Errorf("--mig-rescan-interval=%s is negative; give a duration such as 10s, or 0 to read the MIG layout only at start and on SIGHUP", c.MIGRescan))
	}
	if err := backend.Validate(c.NVML); err != nil {
		errs = append(errs, fmt.Errorf("--nvml=%s is not valid: %w", contract.Quote(c.NVML), err))
	}
	if c.OnNVMLError != OnNVMLErrorExit && c.OnNVMLError != OnNVMLErrorWait {
		errs = append(errs, fmt.Errorf("--on-nvml-error=%s is not valid; use exit or wait", contract.Quote(c.OnNVMLError)))
	}
	if err := parser.ValidateVendorName(c.CDIVendor); err != nil {
		errs = append(errs, fmt.Errorf("--cdi-vendor=%s: %w", contract.Quote(c.CDIVendor), err))
	}
	if err := parser.ValidateClassName(c.CDIClass); err != nil {
		errs = append(errs, fmt.Errorf("--cdi-class=%s: %w", contract.Quote(c.CDIClass), err))
	}
	if !filepath.IsAbs(c.CDISpecDir) {
		errs = append(errs, fmt.Errorf("--cdi-spec-dir=%s is not an absolute path; give the host directory containerd reads CDI specs from (%s)", contract.Quote(c.CDISpecDir), contract.CDISpecDir))
	}
	if c.DevRoot != "" && !filepath.IsAbs(c.DevRoot) {
		errs = append(errs, fmt.Errorf("--dev-root=%s is not an absolute path; give the directory whose dev/ holds /dev/nvidia* (/ on the host)", contract.Quote(c.DevRoot)))
	}
	if c.HookBinary != "" && !filepath.IsAbs(c.HookBinary) {
		errs = append(errs, fmt.Errorf("--hook-binary=%s is not an absolute path; give the hook program's path on the host, such as /var/lib/nvinject/bin/nvinject-cdi-hook", contract.Quote(c.HookBinary)))
	}
	if c.PodResourcesSocket != "" && !filepath.IsAbs(c.PodResourcesSocket) {
		errs = append(errs, fmt.Errorf("--pod-resources-socket=%s is not an absolute path; give kubelet's socket (%s), or empty to disable", contract.Quote(c.PodResourcesSocket), DefaultPodResourcesSocket))
	}
	if err := validateResourceName(c.ResourceName); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.NodeName != "":
	case c.apiAlways:
		errs = append(errs, errors.New("--node-name is empty; set NODE_NAME from the downward API (fieldRef spec.nodeName)"))
	case c.NodeLabels:
		// A command line from before the labels existed keeps working.
		c.NodeLabels = false
		c.warnings = append(c.warnings, "--node-name is empty, so the GPU labels are not published (as if --node-labels=false); set NODE_NAME from the downward API (fieldRef spec.nodeName) to publish them")
	}
	return errs
}

// Warnings are what Validate let through with a default the operator may
// not have meant, for the binary to log once at start.
func (c Config) Warnings() []string { return c.warnings }

// UsesAPI reports whether the node reaches the API server: to publish its
// labels, or because the binary always does.
func (c Config) UsesAPI() bool { return c.NodeLabels || c.apiAlways }

// Logger builds the logger --log-format and --log-level ask for.
func (c Config) Logger(stderr io.Writer) (*slog.Logger, error) { return c.Log.Logger(stderr) }

// Attrs renders the settings for the effective configuration's log line.
func (c Config) Attrs() []any {
	xids := make([]string, len(c.IgnoredXids))
	for i, x := range c.IgnoredXids {
		xids[i] = strconv.FormatUint(x, 10)
	}
	return []any{
		"version", version.Version, "revision", version.Rev(),
		"nvml", c.NVML, "driver_root", c.DriverRoot, "host_driver_root", c.HostDriverRoot, "dev_root", driverroot.DevRoot(c.DriverRoot, c.DevRoot), "hook_binary", c.HookBinary,
		"cdi_spec_dir", c.CDISpecDir, "cdi_kind", contract.CDIKind(c.CDIVendor, c.CDIClass),
		"visible_devices", c.VisibleDevices, "mig_strategy", string(c.MIGStrategy),
		"ignored_xids", strings.Join(xids, ","), "health_quiet_period", c.QuietPeriod.String(), "health_update_interval", c.HealthUpdate.String(), "mig_rescan_interval", c.MIGRescan.String(), "driver_check_interval", c.DriverCheck.String(), "on_nvml_error", c.OnNVMLError,
		"resource_name", c.ResourceName, "pod_resources_socket", c.PodResourcesSocket, "state_dir", c.StateDir,
		"metrics_addr", c.MetricsAddr, "mps_dir", c.MPSDir, "host_mps_dir", c.HostMPSDir,
		"node_name", c.NodeName, "kubeconfig", cmp.Or(c.Kubeconfig, "in-cluster"), "node_labels", c.NodeLabels,
	}
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

// validateResourceName checks r is an extended resource name.
func validateResourceName(r string) error {
	domain, name, ok := strings.Cut(r, "/")
	if !ok || domain == "" || name == "" || strings.Contains(name, "/") || strings.HasPrefix(domain, "kubernetes.io") || !strings.Contains(domain, ".") {
		return fmt.Errorf("--resource-name=%s is not a valid extended resource; use <domain>/<name> such as nvidia.com/gpu", contract.Quote(r))
	}
	return nil
}
