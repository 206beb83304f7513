package kubelocal

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// apiClient talks to the node's API server as the admin identity. A raw REST client is
// enough for readiness and teardown and keeps client-go out of this package.
type apiClient struct {
	base string
	http *http.Client
}

func (n *Node) apiClient() (*apiClient, error) {
	dir := n.layout.pki()
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "admin.crt"), filepath.Join(dir, "admin.key"))
	if err != nil {
		return nil, fmt.Errorf("load admin certificate (is the node up?): %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read node CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}
	return &apiClient{base: n.apiServerURL(), http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}, nil
}

// do sends a request and decodes a JSON answer into out (when non-nil).
func (c *apiClient) do(ctx context.Context, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, body)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(body, out)
}

type condition struct{ Type, Status, Reason, Message string }

type nodeObject struct {
	Status struct{ Conditions []condition } `json:"status"`
}

// nodeReady returns nil once the node reports Ready=True, else why it is not.
func (c *apiClient) nodeReady(ctx context.Context, name string) error {
	var node nodeObject
	if err := c.do(ctx, http.MethodGet, "/api/v1/nodes/"+name, &node); err != nil {
		return err
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == "Ready" {
			if cond.Status == "True" {
				return nil
			}
			return fmt.Errorf("node %s Ready=%s: %s", name, cond.Status, cond.Message)
		}
	}
	return fmt.Errorf("node %s has no Ready condition yet", name)
}

type podList struct {
	Items []struct {
		Metadata struct{ Name, Namespace string } `json:"metadata"`
	} `json:"items"`
}

// pods lists every pod as namespace/name.
func (c *apiClient) pods(ctx context.Context) ([][2]string, error) {
	var list podList
	if err := c.do(ctx, http.MethodGet, "/api/v1/pods", &list); err != nil {
		return nil, err
	}
	out := make([][2]string, 0, len(list.Items))
	for _, p := range list.Items {
		out = append(out, [2]string{p.Metadata.Namespace, p.Metadata.Name})
	}
	return out, nil
}

func (c *apiClient) deletePod(ctx context.Context, ns, name string, grace int) error {
	return c.do(ctx, http.MethodDelete, fmt.Sprintf("/api/v1/namespaces/%s/pods/%s?gracePeriodSeconds=%d", ns, name, grace), nil)
}

// probeHTTP returns nil when url answers 200; TLS is not verified because the
// scheduler and controller-manager serve self-signed health endpoints on loopback.
func probeHTTP(ctx context.Context, url string) error {
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	return nil
}
