package kubelocal

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"
)

func TestWriteConfigsMergesDropIn(t *testing.T) {
	dir := t.TempDir()
	n := New(WithRunDir(dir), WithToolsBin("/tools"), WithContainerdDropIn("testdata/dropin.toml"))
	if err := os.MkdirAll(n.layout.path("kubeconfig"), 0o700); err != nil {
		t.Fatal(err)
	}
	creds, err := n.writeCredentials()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.writeConfigs(creds); err != nil {
		t.Fatal(err)
	}

	var main map[string]any
	readTOML(t, n.layout.containerdConfig(), &main)
	dropIn := filepath.Join(n.layout.containerdDropIns(), "dropin.toml")
	if imports := main["imports"].([]any); len(imports) != 1 || imports[0] != dropIn {
		t.Fatalf("imports = %v, want [%s]", imports, dropIn)
	}
	var merged map[string]any
	readTOML(t, dropIn, &merged)
	cri := table(table(merged, "plugins"), criPlugin)
	dirs := cri["cdi_spec_dirs"].([]any)
	if len(dirs) != 3 || dirs[0] != n.layout.cdiDir() || !slices.Contains(dirs, any("/etc/cdi")) {
		t.Errorf("cdi_spec_dirs = %v, want the node's dir first, then the drop-in's", dirs)
	}
	opts := table(table(table(table(cri, "containerd"), "runtimes"), "nvidia"), "options")
	if opts["BinaryName"] != "/tools/runc" {
		t.Errorf("nvidia BinaryName = %v, want the pinned runc", opts["BinaryName"])
	}
	nri := table(table(merged, "plugins"), nriPlugin)
	if _, ok := nri["socket_path"]; ok {
		t.Errorf("drop-in still overrides the NRI socket: %v", nri)
	}
	if nri["plugin_request_timeout"] != "2s" {
		t.Errorf("drop-in lost its other NRI settings: %v", nri)
	}

	kubelet, err := os.ReadFile(n.layout.kubeletConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"failCgroupV1: false", "unix://" + n.layout.containerdSocket(), "port: 10350"} {
		if !strings.Contains(string(kubelet), want) {
			t.Errorf("kubelet config lacks %q", want)
		}
	}
}

func readTOML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := toml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func TestComponentArgsAppendToTheComponent(t *testing.T) {
	n := New(WithControlPlaneOnly(), WithToolsBin(t.TempDir()),
		WithComponentArgs("kube-apiserver", "--max-requests-inflight=800"),
		WithComponentArgs("kube-scheduler", "--kube-api-qps=200"))
	for _, c := range n.components() {
		got := slices.Contains(c.args, "--max-requests-inflight=800") || slices.Contains(c.args, "--kube-api-qps=200")
		want := c.name == "kube-apiserver" || c.name == "kube-scheduler"
		if got != want {
			t.Errorf("%s: extra flag present = %v, want %v (args %v)", c.name, got, want, c.args)
		}
	}
	bad := New(WithControlPlaneOnly(), WithToolsBin(t.TempDir()), WithComponentArgs("kube-proxy", "--v=2"))
	if err := bad.checkPrereqs(); err == nil || !strings.Contains(err.Error(), "kube-proxy") {
		t.Errorf("checkPrereqs with flags for kube-proxy = %v, want an error naming it", err)
	}
}
