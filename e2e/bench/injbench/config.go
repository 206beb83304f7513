package injbench

import (
	"bytes"
	_ "embed"
	"fmt"
	"path/filepath"
	"text/template"

	"github.com/nvinject/nvinject/shared/contract"
)

// Runtime handlers of the benchmark's containerd. HandlerNative is one
// nvinject-nri does not serve, so only containerd's own CDI acts there;
// HandlerNRI is the one nvinject-nri serves.
const (
	HandlerNative = "runc-cdi"
	HandlerNRI    = contract.RuntimeHandler
)

//go:embed containerd.toml.tmpl
var containerdTemplate string

// layout places everything of one run under a short dir (unix socket paths
// must stay under ~100 bytes).
type layout struct{ dir string }

func (l layout) path(elem ...string) string {
	return filepath.Join(append([]string{l.dir}, elem...)...)
}

func (l layout) logs() string             { return l.path("logs") }
func (l layout) containerdConfig() string { return l.path("containerd", "config.toml") }
func (l layout) containerdSocket() string { return l.path("containerd", "containerd.sock") }
func (l layout) nriSocket() string        { return l.path("nri", "nri.sock") }
func (l layout) cdiDir() string           { return l.path("cdi") }
func (l layout) driverRoot() string       { return l.path("driver-root") }
func (l layout) images() string           { return l.path("images") }

// containerdConfig is what the containerd template needs.
type containerdConfig struct {
	Root, State, Socket, OptDir           string
	NRISocket, NRIPluginDir, NRIConfigDir string
	CDIDir, Runc, RuncRoot, SandboxImage  string
	CNIBinDir, CNIConfDir                 string
	Handlers                              []string
}

func newContainerdConfig(l layout, runc, sandboxImage string) containerdConfig {
	return containerdConfig{
		Root: l.path("containerd", "root"), State: l.path("containerd", "state"),
		Socket: l.containerdSocket(), OptDir: l.path("containerd", "opt"),
		NRISocket: l.nriSocket(), NRIPluginDir: l.path("nri", "plugins"), NRIConfigDir: l.path("nri", "conf"),
		CDIDir: l.cdiDir(), Runc: runc, RuncRoot: l.path("runc"), SandboxImage: sandboxImage,
		CNIBinDir: l.path("cni", "bin"), CNIConfDir: l.path("cni", "net.d"),
		Handlers: []string{"runc", HandlerNative, HandlerNRI},
	}
}

// dirs are the directories containerd expects to exist before it starts.
func (c containerdConfig) dirs() []string {
	return []string{c.Root, c.State, c.OptDir, filepath.Dir(c.Socket), filepath.Dir(c.NRISocket),
		c.NRIPluginDir, c.NRIConfigDir, c.CDIDir, c.RuncRoot, c.CNIBinDir, c.CNIConfDir}
}

// render returns the config.toml text.
func (c containerdConfig) render() ([]byte, error) {
	t, err := template.New("containerd.toml").Option("missingkey=error").Parse(containerdTemplate)
	if err != nil {
		return nil, fmt.Errorf("parse the embedded containerd template: %w", err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, c); err != nil {
		return nil, fmt.Errorf("render the containerd config: %w", err)
	}
	return b.Bytes(), nil
}
