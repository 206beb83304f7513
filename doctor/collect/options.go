package collect

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/nvinject/nvinject/shared/contract"
)

// Options say where the doctor reads its evidence. The zero value of a
// field means its default (see Defaults); an input that cannot be read
// makes the layers needing it "unknown".
type Options struct {
	// Kubeconfig is the kubeconfig file; empty uses KUBECONFIG or
	// ~/.kube/config. Client, when set, is used instead.
	Kubeconfig string
	Client     kubernetes.Interface
	// NoKube skips the API server (node-local evidence only).
	NoKube bool
	// Remote says the doctor does not run on the worker: its files,
	// sockets, nvidia-smi and daemon metrics are not read (the layers that
	// need them say unknown) rather than mistaking this machine's for them.
	Remote bool
	// Node is the worker's Node name; empty picks the only node, or the
	// only node publishing Resource.
	Node string

	KubeletDir string
	// PodResourcesSocket is kubelet's PodResources socket, which says
	// which container holds which device.
	PodResourcesSocket string
	CDISpecDirs        []string
	ContainerdConfig   string
	// DriverRoot is the NVIDIA driver's root as the doctor sees it (the
	// host's /, a driver container's /run/nvidia/driver); empty takes the
	// one the spec-writing daemon's pod names, else /.
	DriverRoot string
	// NvidiaSMI is the nvidia-smi command line; a prefix can reach into
	// the worker ("docker exec k8s-ai-infra-worker nvidia-smi").
	NvidiaSMI string

	// DevicePluginMetrics and NRIMetrics are the daemons' metrics URLs;
	// empty finds each daemon's pod on the node through the API server
	// (DaemonNamespace, label contract.AppLabel) and reads its pod IP.
	DevicePluginMetrics string
	NRIMetrics          string
	// DRAMetrics is nvinject-dra's metrics URL, found like the others.
	DRAMetrics      string
	DaemonNamespace string

	// Mode forces the node's mode (contract.DRAModeDevicePlugin or
	// contract.DRAModeDRA); empty detects it (label, then daemons).
	Mode string

	// PodSelector selects the application's pods; empty takes every pod on
	// the node that requests Resource.
	PodSelector  string
	PodNamespace string

	Resource     string
	RuntimeClass string
	// CDIVendor and CDIClass are nvinject's CDI kind; names are
	// vendor/class=<GPU UUID>.
	CDIVendor string
	CDIClass  string

	ConfigMapNamespace string
	ConfigMapName      string
	ConfigMapKey       string

	// Exec runs a command in a container (the doctor builds it from the
	// kubeconfig when Client is not given); nil skips the in-pod probe.
	Exec ExecFunc
	// Probe is the command the application layer runs in each running
	// application container (default gpu-probe --json, which the vLLM
	// stand-in's image carries).
	Probe []string

	LogTailLines int64
	HTTPClient   *http.Client
	Logger       *slog.Logger
	Now          func() time.Time
}

// defaultAPITimeout bounds each request to the API server.
const defaultAPITimeout = 10 * time.Second

// Defaults are the default paths, names and ports.
func Defaults() Options {
	return Options{
		KubeletDir:         "/var/lib/kubelet/device-plugins",
		PodResourcesSocket: "/var/lib/kubelet/pod-resources/kubelet.sock",
		CDISpecDirs:        contract.CDISpecDirs(),
		ContainerdConfig:   "/etc/containerd/config.toml",
		NvidiaSMI:          "nvidia-smi",
		DaemonNamespace:    contract.Namespace,
		Resource:           contract.ResourceName,
		RuntimeClass:       contract.RuntimeHandler,
		CDIVendor:          contract.CDIVendor,
		CDIClass:           contract.CDIClass,
		ConfigMapNamespace: contract.Namespace,
		ConfigMapName:      contract.ConfigMapName,
		ConfigMapKey:       contract.ConfigMapKey,
		Probe:              []string{"gpu-probe", "--json"},
		LogTailLines:       60,
		HTTPClient:         &http.Client{Timeout: 5 * time.Second},
		Logger:             slog.Default(),
		Now:                time.Now,
	}
}

// WithDefaults fills zero fields from Defaults.
func (o Options) WithDefaults() Options {
	d := Defaults()
	str := func(p *string, def string) {
		if *p == "" {
			*p = def
		}
	}
	str(&o.KubeletDir, d.KubeletDir)
	str(&o.PodResourcesSocket, d.PodResourcesSocket)
	str(&o.ContainerdConfig, d.ContainerdConfig)
	str(&o.NvidiaSMI, d.NvidiaSMI)
	str(&o.DaemonNamespace, d.DaemonNamespace)
	str(&o.Resource, d.Resource)
	str(&o.RuntimeClass, d.RuntimeClass)
	str(&o.CDIVendor, d.CDIVendor)
	str(&o.CDIClass, d.CDIClass)
	str(&o.ConfigMapNamespace, d.ConfigMapNamespace)
	str(&o.ConfigMapName, d.ConfigMapName)
	str(&o.ConfigMapKey, d.ConfigMapKey)
	if len(o.CDISpecDirs) == 0 {
		o.CDISpecDirs = d.CDISpecDirs
	}
	if len(o.Probe) == 0 {
		o.Probe = d.Probe
	}
	if o.LogTailLines == 0 {
		o.LogTailLines = d.LogTailLines
	}
	if o.HTTPClient == nil {
		o.HTTPClient = d.HTTPClient
	}
	if o.Logger == nil {
		o.Logger = d.Logger
	}
	if o.Now == nil {
		o.Now = d.Now
	}
	return o
}

// ExecFunc runs cmd in a container and returns its stdout (also with an
// error, when the command ran and failed).
type ExecFunc func(ctx context.Context, ns, pod, container string, cmd ...string) (string, error)
