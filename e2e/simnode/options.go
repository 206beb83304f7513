package simnode

import "log/slog"

const (
	// DriverRoot is the host path the local-sim overlay mounts as the driver root.
	DriverRoot = "/var/lib/nvinject-sim/driver-root"
	// DefaultNVML is the simulated node of the local-sim overlay.
	DefaultNVML = "sim:a100-80gb"

	DevicePluginImage = "nvinject.local/nvinject-device-plugin:dev"
	NRIImage          = "nvinject.local/nvinject-nri:dev"
	VLLMImage         = "nvinject.local/vllm-standin:dev"
	BusyboxImage      = "nvinject.local/busybox:dev"

	Namespace    = "nvidia-device-plugin"
	DevicePlugin = "single-gpu-device-plugin"
	NRIPlugin    = "nvinject-nri"
	// Resource is the extended resource the device plugin publishes.
	Resource = "nvidia.com/gpu"
	// RequiredPluginsAnnotation makes containerd refuse a pod while nvinject-nri is
	// not connected; the admission policy requires it on nvidia pods.
	RequiredPluginsAnnotation = "required-plugins.noderesource.dev/pod"
)

// Option configures a Deployer.
type Option func(*Deployer)

// WithRepoRoot sets the nvinject checkout (deploy/ and e2e/simnode/vllm live there).
func WithRepoRoot(dir string) Option { return func(d *Deployer) { d.repo = dir } }

// WithBinDir sets where `make build` put nvinject's programs.
func WithBinDir(dir string) Option { return func(d *Deployer) { d.bin = dir } }

// WithToolsBin sets the pinned tools dir (kubectl).
func WithToolsBin(dir string) Option { return func(d *Deployer) { d.tools = dir } }

// WithDriver sets the host's driver root (ChooseDriver); the default is the
// SIMULATED one.
func WithDriver(drv Driver) Option { return func(d *Deployer) { d.driver = drv } }

// WithLogger sets the progress logger.
func WithLogger(l *slog.Logger) Option { return func(d *Deployer) { d.log = l } }
