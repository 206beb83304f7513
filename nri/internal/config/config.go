// Package config parses the NRI plugin's command line. Everything is a
// flag, so the plugin runs the same under systemd, in a DaemonSet or in a
// test; nothing is read from the environment.
package config

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
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
	MetricsAddr        string
	LogFormat          string
	LogLevel           string
	RequestDeadline    time.Duration
	SimDelay           time.Duration
}

// Defaults for the repeatable flags, used when a flag is not given at all.
var (
	DefaultSpecDirs = contract.CDISpecDirs()
	DefaultHandlers = []string{contract.RuntimeHandler}
)

var idxRE = regexp.MustCompile(`^[0-9]{2}$`)

// list is a repeatable string flag; the first use replaces the default.
type list struct {
	vals []string
	set  bool
}

func (l *list) String() string { return strings.Join(l.vals, ",") }
func (l *list) Set(v string) error {
	if !l.set {
		l.vals, l.set = nil, true
	}
	l.vals = append(l.vals, v)
	return nil
}

// Parse parses args (without the program name).
func Parse(args []string, stderr io.Writer) (Config, error) {
	var c Config
	fs := flag.NewFlagSet("nvinject-nri", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dirs := &list{vals: DefaultSpecDirs}
	handlers := &list{vals: DefaultHandlers}
	fs.StringVar(&c.SocketPath, "socket-path", "/var/run/nri/nri.sock", "NRI socket of the runtime")
	fs.StringVar(&c.PluginName, "plugin-name", contract.NRIPluginName, "NRI plugin name")
	fs.StringVar(&c.PluginIdx, "plugin-idx", contract.NRIPluginIndex, "NRI plugin index (two digits; lower runs earlier)")
	fs.Var(dirs, "cdi-spec-dir", "CDI spec directory (repeatable; default /etc/cdi and /var/run/cdi)")
	fs.Var(handlers, "runtime-handler", "runtime handler (RuntimeClass handler) whose pods get GPUs (repeatable; default nvidia)")
	fs.StringVar(&c.CDIVendor, "cdi-vendor", contract.CDIVendor, "CDI vendor of nvinject's GPU devices")
	fs.StringVar(&c.CDIClass, "cdi-class", contract.CDIClass, "CDI class of nvinject's GPU devices")
	fs.StringVar(&c.AnnotationPrefix, "annotation-prefix", contract.AnnotationPrefix, `the device plugin's name in its cdi.k8s.io/<prefix>_<device-id> annotations ("" takes every cdi.k8s.io/ annotation)`)
	fs.StringVar(&c.PodResourcesSocket, "pod-resources-socket", "", "kubelet PodResources socket; when set, each container's UUIDs must match kubelet's assignment")
	fs.StringVar(&c.ResourceName, "resource-name", contract.ResourceName, "extended resource compared with kubelet's PodResources")
	fs.StringVar(&c.NVML, "nvml", "", `GPU inventory read once at start for the UUID-to-minor check: "real", "sim:a100-80gb[*N]", or empty to trust the CDI specs`)
	fs.StringVar(&c.DriverRoot, "driver-root", "/", "where the driver's files are, for --nvml=real")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", ":9482", "address serving /metrics, /healthz and /readyz (empty disables)")
	fs.StringVar(&c.LogFormat, "log-format", "json", "log format: json or text")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.DurationVar(&c.RequestDeadline, "request-deadline", time.Second, "refuse a container whose CreateContainer or validation takes longer; keep it well below containerd's plugin_request_timeout (2s), past which containerd skips the plugin")
	fs.DurationVar(&c.SimDelay, "sim-delay", 0, "SIMULATION ONLY (needs --nvml=sim:...): make every CreateContainer of a served runtime handler's pod wait this long first, to play a slow plugin")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments %q; nvinject-nri takes flags only", fs.Args())
	}
	c.CDISpecDirs, c.RuntimeHandlers = dirs.vals, handlers.vals
	return c, c.validate()
}

func (c Config) validate() error {
	switch {
	case !idxRE.MatchString(c.PluginIdx):
		return fmt.Errorf("--plugin-idx=%q must be two digits, e.g. 10", c.PluginIdx)
	case c.PluginName == "":
		return fmt.Errorf("--plugin-name must not be empty")
	case c.SocketPath == "":
		return fmt.Errorf("--socket-path must not be empty")
	case c.CDIVendor == "" || c.CDIClass == "":
		return fmt.Errorf("--cdi-vendor and --cdi-class must not be empty")
	case c.RequestDeadline <= 0:
		return fmt.Errorf("--request-deadline=%s must be positive, e.g. 1s (below containerd's plugin_request_timeout)", c.RequestDeadline)
	case c.SimDelay < 0:
		return fmt.Errorf("--sim-delay=%s must not be negative", c.SimDelay)
	case c.SimDelay > 0 && !c.Simulated():
		return fmt.Errorf("--sim-delay is SIMULATION ONLY and needs --nvml=sim:...; remove it on a real node")
	}
	for _, h := range c.RuntimeHandlers {
		if h == "" {
			return fmt.Errorf("--runtime-handler must not be empty; the default runtime is not a GPU runtime")
		}
	}
	return nil
}

// Simulated reports whether the GPUs are simulated (--nvml=sim:...), which
// enables the SIMULATION-only fault injection.
func (c Config) Simulated() bool { return strings.HasPrefix(c.NVML, "sim:") }
