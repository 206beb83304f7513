package kubeclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://203.0.113.7:6443
users:
- name: u
  user:
    token: t
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestConfigFromKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config(path, "nvinject-test")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://203.0.113.7:6443" || cfg.UserAgent != "nvinject-test" || cfg.BearerToken != "t" {
		t.Errorf("host %q, user agent %q, token %q", cfg.Host, cfg.UserAgent, cfg.BearerToken)
	}
}

// Without a kubeconfig outside a pod the error says both ways in, with
// the program's service account.
func TestConfigOutsideAPod(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	_, err := Config("", "nvinject-test")
	if err == nil {
		t.Skip("running in a pod with a service account")
	}
	for _, want := range []string{"--kubeconfig=", "give a kubeconfig", "the nvinject-test service account", "KUBERNETES_SERVICE_HOST"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if _, err := Config(filepath.Join(t.TempDir(), "missing"), "nvinject-test"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("a missing kubeconfig: %v", err)
	}
}
