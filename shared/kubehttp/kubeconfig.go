package kubehttp

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// kubeconfig is the part of a kubeconfig file this client reads.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Contexts       []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster string `json:"cluster"`
			User    string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
	Clusters []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData []byte `json:"certificate-authority-data"`
			TLSServerName            string `json:"tls-server-name"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			Token                 string `json:"token"`
			TokenFile             string `json:"tokenFile"`
			ClientCertificate     string `json:"client-certificate"`
			ClientCertificateData []byte `json:"client-certificate-data"`
			ClientKey             string `json:"client-key"`
			ClientKeyData         []byte `json:"client-key-data"`
			Username              string `json:"username"`
			Exec                  any    `json:"exec"`
			AuthProvider          any    `json:"auth-provider"`
		} `json:"user"`
	} `json:"users"`
}

// maxKubeconfig bounds the file read.
const maxKubeconfig = 4 << 20

func fromKubeconfig(path string) (*Client, error) {
	data, err := readBounded(path, maxKubeconfig)
	if err != nil {
		return nil, err
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	if kc.CurrentContext == "" {
		return nil, fmt.Errorf("kubeconfig %s has no current-context", path)
	}
	dir := filepath.Dir(path)
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	var clusterName, userName string
	found := false
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName, found = c.Context.Cluster, c.Context.User, true
		}
	}
	if !found {
		return nil, fmt.Errorf("kubeconfig %s: current-context %s is not among its contexts", path, kc.CurrentContext)
	}
	var tc tlsConfig
	host := ""
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		host, tc.serverName, tc.insecure = c.Cluster.Server, c.Cluster.TLSServerName, c.Cluster.InsecureSkipTLSVerify
		if tc.ca, err = fileOrData(rel(c.Cluster.CertificateAuthority), c.Cluster.CertificateAuthorityData); err != nil {
			return nil, fmt.Errorf("kubeconfig %s, cluster %s: certificate-authority: %w", path, clusterName, err)
		}
	}
	if host == "" {
		return nil, fmt.Errorf("kubeconfig %s: cluster %s is missing or has no server", path, clusterName)
	}
	var t *token
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		switch {
		case u.User.Exec != nil, u.User.AuthProvider != nil, u.User.Username != "":
			return nil, fmt.Errorf("kubeconfig %s, user %s: exec plugins, auth providers and basic auth are not supported here; give a token, a token file or a client certificate", path, userName)
		case u.User.TokenFile != "":
			t = &token{file: rel(u.User.TokenFile)}
		case u.User.Token != "":
			t = &token{value: u.User.Token}
		}
		if tc.cert, err = fileOrData(rel(u.User.ClientCertificate), u.User.ClientCertificateData); err != nil {
			return nil, fmt.Errorf("kubeconfig %s, user %s: client-certificate: %w", path, userName, err)
		}
		if tc.key, err = fileOrData(rel(u.User.ClientKey), u.User.ClientKeyData); err != nil {
			return nil, fmt.Errorf("kubeconfig %s, user %s: client-key: %w", path, userName, err)
		}
	}
	if t != nil {
		if _, err := t.get(); err != nil {
			return nil, fmt.Errorf("kubeconfig %s, user %s: %w", path, userName, err)
		}
	}
	c, err := newClient(host, tc, t)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return c, nil
}

// fileOrData is data, or else the file's contents.
func fileOrData(file string, data []byte) ([]byte, error) {
	if len(data) > 0 || file == "" {
		return data, nil
	}
	return readBounded(file, 1<<20)
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}
