package kubelocal

import (
	"fmt"
	"net"
	"os"

	"github.com/nvinject/nvinject/e2e/internal/pki"
)

// credentials are the files the control plane and kubelet authenticate with.
type credentials struct {
	ca                      *pki.CA
	apiserver, kubeletServe pki.Pair
	apiserverKubeletClient  pki.Pair
	saKey, saPub            string
}

// clientIdentities maps each kubeconfig to the identity it authenticates as.
var clientIdentities = []struct {
	name, cn string
	org      []string
}{
	{"admin", "nvinject-admin", []string{"system:masters"}},
	{"controller-manager", "system:kube-controller-manager", nil},
	{"scheduler", "system:kube-scheduler", nil},
}

// writeCredentials creates a fresh CA, every certificate and a kubeconfig per client.
func (n *Node) writeCredentials() (*credentials, error) {
	dir := n.layout.pki()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pki dir: %w", err)
	}
	ca, err := pki.NewCA(dir, "nvinject-local-ca")
	if err != nil {
		return nil, err
	}
	c := &credentials{ca: ca}
	loopback := []net.IP{net.IPv4(127, 0, 0, 1)}
	if c.apiserver, err = ca.Issue(pki.Request{
		Name: "apiserver", CommonName: "kube-apiserver", Server: true, IPs: append(loopback, net.IPv4(10, 96, 0, 1), net.ParseIP(nodesGateway)),
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}); err != nil {
		return nil, err
	}
	if c.apiserverKubeletClient, err = ca.Issue(pki.Request{
		Name: "apiserver-kubelet-client", CommonName: "kube-apiserver-kubelet-client",
		Organization: []string{"system:masters"}, Client: true,
	}); err != nil {
		return nil, err
	}
	if c.kubeletServe, err = ca.Issue(pki.Request{
		Name: "kubelet-serving", CommonName: n.name, Server: true, IPs: loopback,
		DNSNames: []string{n.name, "localhost"},
	}); err != nil {
		return nil, err
	}
	if c.saKey, c.saPub, err = pki.WriteKeyPair(dir, "service-account"); err != nil {
		return nil, err
	}
	kubelet, err := ca.Issue(pki.Request{
		Name: "kubelet-client", CommonName: "system:node:" + n.name,
		Organization: []string{"system:nodes"}, Client: true,
	})
	if err != nil {
		return nil, err
	}
	if err := n.writeKubeconfig("kubelet", ca.CertFile, kubelet); err != nil {
		return nil, err
	}
	for _, id := range clientIdentities {
		pair, err := ca.Issue(pki.Request{Name: id.name, CommonName: id.cn, Organization: id.org, Client: true})
		if err != nil {
			return nil, err
		}
		if err := n.writeKubeconfig(id.name, ca.CertFile, pair); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (n *Node) writeKubeconfig(name, caFile string, pair pki.Pair) error {
	return n.writeKubeconfigAt(n.layout.kubeconfig(name), name, caFile, pair)
}

func (n *Node) writeKubeconfigAt(path, name, caFile string, pair pki.Pair) error {
	const tmpl = `apiVersion: v1
kind: Config
clusters:
- name: nvinject
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: nvinject
  context:
    cluster: nvinject
    user: %s
current-context: nvinject
`
	body := fmt.Sprintf(tmpl, n.apiServerURL(), caFile, name, pair.CertFile, pair.KeyFile, name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		return fmt.Errorf("write %s kubeconfig: %w", name, err)
	}
	return nil
}
