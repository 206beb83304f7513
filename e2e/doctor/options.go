package doctor

import (
	"log/slog"
	"net/http"
	"time"

	"k8s.io/client-go/kubernetes"
)

// Metric names the doctor reads from the daemons' /metrics
// (deviceplugin/internal/metrics and nri/internal/metrics).
const (
	// MetricRegistrations{result="ok"|"error"} counts Register calls.
	MetricRegistrations = "nvinject_device_plugin_registrations_total"
	MetricStreams       = "nvinject_device_plugin_list_and_watch_streams"
	// MetricDeviceHealthy{uuid,device_id} is 1 when Healthy.
	MetricDeviceHealthy = "nvinject_device_plugin_device_healthy"
	// MetricHealthEvents{kind,xid,ignored} counts NVML health events.
	MetricHealthEvents = "nvinject_device_plugin_health_events_total"
	// MetricAllocations{result="ok"|"refused"} counts Allocate requests.
	MetricAllocations  = "nvinject_device_plugin_allocations_total"
	MetricNRIConnected = "nvinject_nri_connected"
	MetricNRIRefusals  = "nvinject_nri_refusals_total"
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

	KubeletDir       string
	CDISpecDirs      []string
	ContainerdConfig string
	// NvidiaSMI is the nvidia-smi command line; a prefix can reach into
	// the worker ("docker exec k8s-ai-infra-worker nvidia-smi").
	NvidiaSMI string

	DevicePluginMetrics string
	NRIMetrics          string

	PodSelector  string
	PodNamespace string

	Resource     string
	RuntimeClass string
	// CDIKind is vendor/class of nvinject's CDI devices; names are
	// CDIKind=<GPU UUID>.
	CDIKind string

	ConfigMapNamespace string
	ConfigMapName      string
	ConfigMapKey       string

	LogTailLines int64
	HTTPClient   *http.Client
	Logger       *slog.Logger
	Now          func() time.Time
}

// Defaults are the seed's paths, names and ports.
func Defaults() Options {
	return Options{
		KubeletDir:          "/var/lib/kubelet/device-plugins",
		CDISpecDirs:         []string{"/etc/cdi", "/var/run/cdi"},
		ContainerdConfig:    "/etc/containerd/config.toml",
		NvidiaSMI:           "nvidia-smi",
		DevicePluginMetrics: "http://127.0.0.1:9481/metrics",
		NRIMetrics:          "http://127.0.0.1:9482/metrics",
		PodSelector:         "app=vllm-demo",
		Resource:            "nvidia.com/gpu",
		RuntimeClass:        "nvidia",
		CDIKind:             "nvidia.com/gpu",
		ConfigMapNamespace:  "nvidia-device-plugin",
		ConfigMapName:       "single-gpu-device-plugin",
		ConfigMapKey:        "selected-gpu-uuid",
		LogTailLines:        60,
		HTTPClient:          &http.Client{Timeout: 5 * time.Second},
		Logger:              slog.Default(),
		Now:                 time.Now,
	}
}

// withDefaults fills zero fields from Defaults.
func (o Options) withDefaults() Options {
	d := Defaults()
	str := func(p *string, def string) {
		if *p == "" {
			*p = def
		}
	}
	str(&o.KubeletDir, d.KubeletDir)
	str(&o.ContainerdConfig, d.ContainerdConfig)
	str(&o.NvidiaSMI, d.NvidiaSMI)
	str(&o.DevicePluginMetrics, d.DevicePluginMetrics)
	str(&o.NRIMetrics, d.NRIMetrics)
	str(&o.PodSelector, d.PodSelector)
	str(&o.Resource, d.Resource)
	str(&o.RuntimeClass, d.RuntimeClass)
	str(&o.CDIKind, d.CDIKind)
	str(&o.ConfigMapNamespace, d.ConfigMapNamespace)
	str(&o.ConfigMapName, d.ConfigMapName)
	str(&o.ConfigMapKey, d.ConfigMapKey)
	if len(o.CDISpecDirs) == 0 {
		o.CDISpecDirs = d.CDISpecDirs
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
