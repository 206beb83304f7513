package kubelocal

import (
	"bytes"
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"text/template"

	"github.com/pelletier/go-toml/v2"

	"github.com/nvinject/nvinject/shared/contract"
)

//go:embed config/kubelet.yaml config/containerd.toml config/cni.conflist
var defaultConfigs embed.FS

const (
	// cniNetwork and cniBridge name what the node's CNI config creates on the host,
	// so teardown can remove exactly that.
	cniNetwork = "nvinject"
	cniBridge  = "nvinject0"
	podSubnet  = "10.233.77.0/24"
	criPlugin  = contract.ContainerdCRIRuntime
	nriPlugin  = contract.ContainerdNRI
	runcShim   = contract.ContainerdRuncShim
)

// templateData is what the config templates can refer to.
type templateData struct {
	ContainerdRoot, ContainerdState, ContainerdSocket string
	Imports                                           []string
	OptDir, NRISocket, NRIPluginDir, NRIConfigDir     string
	SandboxImage                                      string
	CDIDirs                                           []string
	CNIBinDir, CNIConfDir, CNIIPAMDir                 string
	CNINetwork, CNIBridge, PodSubnet                  string
	Runc, RuncRoot                                    string

	StaticPodDir, PodLogsDir, VolumePluginDir string
	KubeletAddress, KubeletHealthzAddress     string
	KubeletPort, KubeletHealthzPort           int
	// CgroupRoot is empty on the first node (kubelet's default, /) and the
	// worker's own cgroup on the others, so their kubepods trees differ.
	CgroupRoot                            string
	KubeletServingCert, KubeletServingKey string
	CAFile                                string
}

func (n *Node) templateData(creds *credentials) templateData {
	l := n.layout
	return templateData{
		ContainerdRoot: l.path("containerd", "root"), ContainerdState: l.path("containerd", "state"),
		ContainerdSocket: l.containerdSocket(),
		OptDir:           l.path("containerd", "opt"),
		NRISocket:        l.nriSocket(), NRIPluginDir: l.path("nri", "plugins"), NRIConfigDir: l.path("nri", "conf.d"),
		SandboxImage: SandboxImage,
		CDIDirs:      append([]string{l.cdiDir()}, n.extraCDIDirs...),
		CNIBinDir:    n.cniBin, CNIConfDir: l.cniConfDir(), CNIIPAMDir: l.cniIPAMDir(),
		CNINetwork: cniNetwork, CNIBridge: cniBridge, PodSubnet: podSubnet,
		Runc: n.tool("runc"), RuncRoot: l.runcRoot(),

		StaticPodDir: l.staticPods(), PodLogsDir: l.path("pod-logs"), VolumePluginDir: l.path("volume-plugins"),
		KubeletAddress: "127.0.0.1", KubeletHealthzAddress: "127.0.0.1",
		KubeletPort: n.ports.Kubelet, KubeletHealthzPort: n.ports.KubeletHealthz,
		KubeletServingCert: creds.kubeletServe.CertFile, KubeletServingKey: creds.kubeletServe.KeyFile,
		CAFile: creds.ca.CertFile,
	}
}

// writeConfigs renders containerd's, kubelet's and the CNI config, merging the
// containerd drop-in when there is one.
func (n *Node) writeConfigs(creds *credentials) error {
	return n.renderConfigs(n.templateData(creds), n.layout.kubeletConfig(), func(p string) string { return p })
}

// renderConfigs writes the configs data describes. The paths in data are the ones the
// node's programs see; onHost maps one to where it is on the host (a worker's own
// directories are mounted over the first node's paths in its mount namespace).
func (n *Node) renderConfigs(data templateData, kubeletConfig string, onHost func(string) string) error {
	if n.dropIn != "" {
		dst := filepath.Join(n.layout.containerdDropIns(), filepath.Base(n.dropIn))
		if err := n.writeDropIn(onHost(dst), data); err != nil {
			return err
		}
		data.Imports = []string{dst}
	}
	files := []struct{ override, embedded, dst string }{
		{n.containerdTemplate, "config/containerd.toml", onHost(n.layout.containerdConfig())},
		{n.kubeletTemplate, "config/kubelet.yaml", kubeletConfig},
		{"", "config/cni.conflist", onHost(filepath.Join(n.layout.cniConfDir(), "10-"+cniNetwork+".conflist"))},
	}
	for _, f := range files {
		if err := render(f.override, f.embedded, f.dst, data); err != nil {
			return err
		}
	}
	return nil
}

func render(override, embedded, dst string, data templateData) error {
	var (
		src []byte
		err error
	)
	if override != "" {
		src, err = os.ReadFile(override)
	} else {
		src, err = defaultConfigs.ReadFile(embedded)
	}
	if err != nil {
		return fmt.Errorf("read config template: %w", err)
	}
	t, err := template.New(filepath.Base(dst)).Option("missingkey=error").Parse(string(src))
	if err != nil {
		return fmt.Errorf("parse template for %s: %w", dst, err)
	}
	var out bytes.Buffer
	if err := t.Execute(&out, data); err != nil {
		return fmt.Errorf("render %s: %w", dst, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("create config dir: %w", err)
	}
	return os.WriteFile(dst, out.Bytes(), 0o644)
}

// writeDropIn copies the deploy drop-in for this instance. containerd merges imports over
// the main config and replaces arrays, so the copy is adjusted to keep the node's own
// sockets, CDI dir and pinned runc: paths the drop-in sets for a real host
// (/var/run/nri/nri.sock, BinaryName = 'runc') must not leak into a test node.
func (n *Node) writeDropIn(dst string, data templateData) error {
	src, err := os.ReadFile(n.dropIn)
	if err != nil {
		return fmt.Errorf("read containerd drop-in: %w", err)
	}
	var cfg map[string]any
	if err := toml.Unmarshal(src, &cfg); err != nil {
		return fmt.Errorf("parse containerd drop-in %s: %w", n.dropIn, err)
	}
	for _, key := range []string{"root", "state", "grpc", "ttrpc", "imports"} {
		n.dropKey(cfg, key)
	}
	plugins := table(cfg, "plugins")
	if nri := table(plugins, nriPlugin); nri != nil {
		for _, key := range []string{"socket_path", "plugin_path", "plugin_config_path"} {
			n.dropKey(nri, key)
		}
	}
	if cri := table(plugins, criPlugin); cri != nil {
		if dirs, ok := cri["cdi_spec_dirs"].([]any); ok {
			merged := slices.Clone(data.CDIDirs)
			for _, d := range dirs {
				if s, ok := d.(string); ok && !slices.Contains(merged, s) {
					merged = append(merged, s)
				}
			}
			cri["cdi_spec_dirs"] = merged
		}
		n.dropKey(cri, "cni")
		for name, rt := range table(table(cri, "containerd"), "runtimes") {
			rt, ok := rt.(map[string]any)
			if !ok || (rt["runtime_type"] != nil && rt["runtime_type"] != runcShim) {
				continue
			}
			opts := table(rt, "options")
			if opts == nil {
				opts = map[string]any{}
				rt["options"] = opts
			}
			opts["BinaryName"], opts["Root"] = data.Runc, data.RuncRoot
			n.log.Debug("containerd drop-in: runtime uses the pinned runc", "runtime", name)
		}
	}
	out, err := toml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode containerd drop-in: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("create drop-in dir: %w", err)
	}
	header := fmt.Sprintf("# Generated from %s for the local node; instance paths stripped.\n", n.dropIn)
	return os.WriteFile(dst, append([]byte(header), out...), 0o644)
}

func (n *Node) dropKey(m map[string]any, key string) {
	if _, ok := m[key]; ok {
		n.log.Info("containerd drop-in: the local node keeps its own value", "key", key)
		delete(m, key)
	}
}

func table(m map[string]any, key string) map[string]any {
	t, _ := m[key].(map[string]any)
	return t
}
