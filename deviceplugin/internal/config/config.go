// Package config reads the device plugin's configuration from flags and
// their environment aliases (NVIDIA's NVIDIA_VISIBLE_DEVICES, MIG_STRATEGY,
// DEVICE_LIST_STRATEGY, DEVICE_ID_STRATEGY, then NVINJECT_<FLAG>): the GPU
// node's settings (gpunode/nodeconfig) and the device plugin protocol's own.
// It is the only place the plugin reads the environment.
package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nvinject/nvinject/gpunode/nodeconfig"
	"github.com/nvinject/nvinject/shared/cli"
	"github.com/nvinject/nvinject/shared/contract"
	"github.com/nvinject/nvinject/shared/kubehttp"
	"github.com/nvinject/nvinject/shared/sharing"
)

// Name is the program name: the user agent and service account.
const Name = "nvinject-device-plugin"

// IDStrategy says which device IDs kubelet sees.
type IDStrategy string

// Device ID strategies.
const (
	IDUUID  IDStrategy = "uuid"
	IDIndex IDStrategy = "index"
)

// Config is the plugin's effective configuration.
type Config struct {
	nodeconfig.Config
	KubeletDir       string
	PluginSocket     string
	AnnotationPrefix string
	Strategies       []contract.Strategy
	IDStrategy       IDStrategy
	// SharingConfig is the time-slicing file (NVIDIA's format); Sharing
	// what it says, empty when the file is absent (its ConfigMap is
	// optional).
	SharingConfig string
	Sharing       sharing.Config
	// InCluster is where the pod's API server is (KUBERNETES_SERVICE_HOST
	// and _PORT) when --kubeconfig is empty: the node labels' client.
	InCluster kubehttp.InCluster
}

// KubeletSocket is the kubelet's registration socket.
func (c Config) KubeletSocket() string { return filepath.Join(c.KubeletDir, "kubelet.sock") }

// Attrs renders the configuration for one structured log line.
func (c Config) Attrs() []any {
	return append(c.Config.Attrs(),
		"kubelet_dir", c.KubeletDir, "plugin_socket", c.PluginSocket, "cdi_annotation_prefix", c.AnnotationPrefix,
		"device_list_strategy", strings.Join(strategyNames(c.Strategies), ","), "device_id_strategy", string(c.IDStrategy),
		"sharing_config", c.SharingConfig, "time_sliced_resources", len(c.Sharing.Sharing.TimeSlicing.Resources),
		"mps_resources", len(c.Sharing.Sharing.MPS.Resources))
}

// Load parses args (without the program name), help to stdout and
// warnings to stderr. A flag given on the command line wins over its
// environment alias (NVIDIA's name, then NVINJECT_<FLAG>), which wins over
// the default.
func Load(args []string, getenv func(string) string, stdout, stderr io.Writer) (Config, error) {
	var c Config
	var strategies, idStrategy string
	cmd := cli.New(Name, "[flags]", cli.WithOutput(stdout, stderr), cli.WithEnvPrefix("NVINJECT_"),
		cli.WithAbout("Publishes the node's selected NVIDIA GPUs to kubelet as an extended resource and answers Allocate with CDI device names only. SIGHUP clears every GPU's Xid and loss marks."))
	node := nodeconfig.Register(cmd, nodeconfig.Defaults{
		MetricsAddr:       fmt.Sprintf(":%d", contract.DevicePluginMetricsPort),
		StateDir:          "/var/lib/nvinject/device-plugin",
		StateDirUsage:     "where the health checkpoint is kept across restarts (a host directory); empty keeps health in memory only",
		ResourceNameUsage: "extended resource to publish",
	})
	fs := cmd.Flags()
	fs.StringVar(&c.KubeletDir, "kubelet-dir", "/var/lib/kubelet/device-plugins", "kubelet's device plugin directory (holds kubelet.sock)")
	fs.StringVar(&c.PluginSocket, "plugin-socket", "nvinject-gpu.sock", "file name of this plugin's socket in --kubelet-dir")
	fs.StringVar(&c.AnnotationPrefix, "cdi-annotation-prefix", contract.AnnotationPrefix, "plugin name in cdi.k8s.io/<prefix>_<device-id> annotation keys")
	fs.StringVar(&strategies, "device-list-strategy", strings.Join(strategyNames(contract.DefaultStrategies()), ","), "how Allocate passes CDI names: cdi-annotations, cdi-cri, nri (comma list)")
	fs.StringVar(&idStrategy, "device-id-strategy", string(IDUUID), "device IDs kubelet sees: uuid or index")
	fs.StringVar(&c.SharingConfig, "sharing-config", "", "sharing configuration file in NVIDIA's device plugin format (version: v1, sharing.timeSlicing or sharing.mps); absent file: no sharing")
	// NVIDIA's device plugin's environment names, tried before NVINJECT_<FLAG>.
	cmd.Env("device-list-strategy", "DEVICE_LIST_STRATEGY")
	cmd.Env("device-id-strategy", "DEVICE_ID_STRATEGY")
	if err := cmd.Parse(args, getenv); err != nil {
		return Config{}, err
	}
	if len(cmd.Args()) > 0 {
		return Config{}, cli.Usagef("unexpected arguments %q; configuration is given by flags and environment only", cmd.Args())
	}

	errs := node.Validate()
	c.Config = *node
	c.InCluster = kubehttp.InCluster{Host: getenv("KUBERNETES_SERVICE_HOST"), Port: getenv("KUBERNETES_SERVICE_PORT")}
	var err error
	if c.Strategies, err = contract.ParseStrategies(strategies); err != nil {
		errs = append(errs, err)
	}
	if c.IDStrategy, err = ParseIDStrategy(idStrategy); err != nil {
		errs = append(errs, err)
	}
	if c.SharingConfig != "" {
		data, err := os.ReadFile(c.SharingConfig)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			errs = append(errs, fmt.Errorf("--sharing-config=%s: %w", c.SharingConfig, err))
		default:
			if c.Sharing, err = sharing.Parse(data); err != nil {
				errs = append(errs, fmt.Errorf("--sharing-config=%s: %w", c.SharingConfig, err))
			}
		}
	}
	if c.PluginSocket == "" || c.PluginSocket == "kubelet.sock" || strings.ContainsRune(c.PluginSocket, '/') {
		errs = append(errs, fmt.Errorf("--plugin-socket=%q is not valid; give a plain file name other than kubelet.sock", c.PluginSocket))
	}
	if c.KubeletDir == "" {
		errs = append(errs, errors.New("--kubelet-dir is empty; give kubelet's device plugin directory"))
	} else if n := len(filepath.Join(c.KubeletDir, c.PluginSocket)); n > 107 {
		errs = append(errs, fmt.Errorf("--kubelet-dir=%q with --plugin-socket=%q makes a %d-byte socket path; unix sockets allow 107", c.KubeletDir, c.PluginSocket, n))
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, cli.UsageError{Err: contract.Bound(err)}
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
