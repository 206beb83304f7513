// Package config parses the NRI plugin's command line and its environment
// aliases (NVINJECT_<FLAG>); it is the only place the plugin reads the
// environment, so the plugin runs the same under systemd, in a DaemonSet or
// in a test.
package config

import (
	"fmt"
	"io"
	"regexp"
	"time"

	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/logging"
)

// Config is the parsed command line.
type Config struct {
	SocketPath         string
	PluginName         string
	PluginIdx          string
	CDISpecDirs        []string
	RuntimeHandlers    []string
	CDIVendor          string
	CDIClass           string
	AnnotationPrefix   string
	PodResourcesSocket string
	ResourceName       string
	NVML               string
	DriverRoot         string
	DevRoot            string
	MetricsAddr        string
	LogFormat          string
	LogLevel           string
	RequestDeadline    time.Duration
	SimDelay           time.Duration
	// Kubeconfig is empty for the in-cluster configuration; NodeName names
	// the node in the audit Events.
	Kubeconfig string
	NodeName   string
}

var idxRE = regexp.MustCompile(`^[0-9]{2}$`)

// Parse parses args (without the program name) and the environment through
// getenv (nil: none); help goes to stdout, warnings to stderr.
func Parse(args []string, getenv func(string) string, stdout, stderr io.Writer) (Config, error) {
	var c Config
	var logFlags logging.Flags
	cmd := cli.New("nvinject-nri", "[flags]", cli.WithOutput(stdout, stderr), cli.WithEnvPrefix("NVINJECT_"),
		cli.WithAbout("nvinject's containerd NRI plugin: for pods of the GPU runtime handlers it resolves the CDI devices allocated to each container, applies their edits and checks the GPU UUIDs the container really gets."))
	fs := cmd.Flags()
	dirs := cli.NewStringList(contract.CDISpecDirs()...)
	handlers := cli.NewStringList(contract.RuntimeHandler)
	fs.StringVar(&c.SocketPath, "socket-path", "/var/run/nri/nri.sock", "NRI socket of the runtime")
	fs.StringVar(&c.PluginName, "plugin-name", contract.NRIPluginName, "NRI plugin name (pods name it in "+contract.RequiredPluginsAnnotation+")")
	fs.StringVar(&c.PluginIdx, "plugin-idx", contract.NRIPluginIndex, "NRI plugin index (two digits; lower runs earlier)")
	fs.Var(dirs, "cdi-spec-dir", "CDI spec directories (comma list, repeatable)")
	fs.Var(handlers, "runtime-handler", "runtime handlers (RuntimeClass handlers) whose pods get GPUs (comma list, repeatable)")
	fs.StringVar(&c.CDIVendor, "cdi-vendor", contract.CDIVendor, "CDI vendor of nvinject's GPU devices")
	fs.StringVar(&c.CDIClass, "cdi-class", contract.CDIClass, "CDI class of nvinject's GPU devices")
	fs.StringVar(&c.AnnotationPrefix, "cdi-annotation-prefix", contract.AnnotationPrefix, `the device plugin's name in its cdi.k8s.io/<prefix>_<device-id> annotations ("" takes every cdi.k8s.io/ annotation)`)
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", "", "kubelet PodResources socket; when set, each container's UUIDs must match kubelet's assignment")
	fs.StringVar(&c.ResourceName, "resource-name", contract.ResourceName, "extended resource compared with kubelet's PodResources (the device plugin's --resource-name)")
	fs.StringVar(&c.NVML, "nvml", "", `GPU inventory read once at start for the UUID-to-minor check: "real", "sim:a100-80gb[*N]", or empty to trust the CDI specs`)
	fs.StringVar(&c.DriverRoot, "driver-root", "/", "where the driver's files are, for --nvml=real")
	fs.StringVar(&c.DevRoot, "dev-root", "", "the directory whose dev/ holds the GPUs' device nodes, for --nvml=real (default: --driver-root when it is a whole system root, with usr/bin or usr/lib; else /)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", fmt.Sprintf(":%d", contract.NRIMetricsPort), "address serving /metrics, /healthz and /readyz (empty disables)")
	fs.DurationVar(&c.RequestDeadline, "request-deadline", time.Second, "refuse a container whose CreateContainer or validation takes longer; keep it well below containerd's plugin_request_timeout (2s), past which containerd skips the plugin")
	fs.DurationVar(&c.SimDelay, "sim-delay", 0, "SIMULATION ONLY (needs --nvml=sim:...): make every CreateContainer of a served runtime handler's pod wait this long first, to play a slow plugin")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig for the API server the audit Events (GPUAdmitted, GPURefused) go to; empty: the in-cluster service account. Without API access the verdicts are the same and only logged")
	fs.StringVar(&c.NodeName, "node-name", "", "this node's name, the audit Events' source host")
	cmd.Env("node-name", "NODE_NAME")
	logFlags.Register(fs, logging.JSON)
	cmd.Deprecated("annotation-prefix", "cdi-annotation-prefix")
	if err := cmd.Parse(args, getenv); err != nil {
		return Config{}, err
	}
	if len(cmd.Args()) > 0 {
		return Config{}, cli.Usagef("unexpected arguments %q; nvinject-nri takes flags only", cmd.Args())
	}
	c.CDISpecDirs, c.RuntimeHandlers = dirs.Values, handlers.Values
	c.LogFormat, c.LogLevel = logFlags.Format, logFlags.Level
	if err := c.validate(); err != nil {
		return Config{}, cli.UsageError{Err: err}
	}
	return c, nil
}

func (c Config) validate() error {
	switch {
	case !idxRE.MatchString(c.PluginIdx):
		return fmt.Errorf("--plugin-idx=%q must be two digits, e.g. %s", c.PluginIdx, contract.NRIPluginIndex)
	case c.PluginName == "":
		return fmt.Errorf("--plugin-name must not be empty")
	case c.SocketPath == "":
		return fmt.Errorf("--socket-path must not be empty")
	case len(c.CDISpecDirs) == 0:
		return fmt.Errorf("--cdi-spec-dir must name at least one directory, e.g. %s", contract.CDISpecDir)
	case len(c.RuntimeHandlers) == 0:
		return fmt.Errorf("--runtime-handler must name at least one handler, e.g. %s; the default runtime is not a GPU runtime", contract.RuntimeHandler)
	case c.RequestDeadline <= 0:
		return fmt.Errorf("--request-deadline=%s must be positive, e.g. 1s (below containerd's plugin_request_timeout)", c.RequestDeadline)
	case c.SimDelay < 0:
		return fmt.Errorf("--sim-delay=%s must not be negative", c.SimDelay)
	case c.SimDelay > 0 && !c.Simulated():
		return fmt.Errorf("--sim-delay is SIMULATION ONLY and needs --nvml=sim:...; remove it on a real node")
	}
	if err := parser.ValidateVendorName(c.CDIVendor); err != nil {
		return fmt.Errorf("--cdi-vendor=%q: %w", c.CDIVendor, err)
	}
	if err := parser.ValidateClassName(c.CDIClass); err != nil {
		return fmt.Errorf("--cdi-class=%q: %w", c.CDIClass, err)
	}
	return nil
}

// Simulated reports whether the GPUs are simulated (--nvml=sim:...), which
// enables the SIMULATION-only fault injection.
func (c Config) Simulated() bool { return contract.IsSimulatedNVML(c.NVML) }
