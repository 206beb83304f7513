package rig

import (
	"log/slog"

	"github.com/nvinject/nvinject/shared/contract"
)

const (
	// DriverRoot is the host path the local-sim overlay mounts as the driver root.
	DriverRoot = "/var/lib/nvinject-sim/driver-root"
	// DefaultNVML is the simulated node of the local-sim overlay.
	DefaultNVML = "sim:a100-80gb"

	VLLMImage    = "nvinject.local/vllm-standin:dev"
	BusyboxImage = "nvinject.local/busybox:dev"

	Namespace    = contract.Namespace
	DevicePlugin = contract.DevicePluginApp
	NRIPlugin    = contract.NRIApp
	// SharingConfigMap holds the device plugin's time-slicing configuration.
	SharingConfigMap = "nvinject-sharing"
	// Resource is the extended resource the device plugin publishes.
	Resource = contract.ResourceName
	// RequiredPluginsAnnotation makes containerd refuse a pod while nvinject-nri is
	// not connected; the admission policy requires it on nvidia pods.
	RequiredPluginsAnnotation = contract.RequiredPluginsAnnotation
)

// Option configures a Deployer.
type Option func(*Deployer)

// WithRepoRoot sets the nvinject checkout (deploy/ and e2e/harness/rig/vllm live there).
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
