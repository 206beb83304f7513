// Package kubehttp is a lean client of the Kubernetes API server for a
// daemon that makes a few plain JSON requests (the device plugin's Node
// labels): the address, TLS and credentials of a kubeconfig file or of the
// pod's service account, over net/http, without client-go. client-go's
// REST transport and kubeconfig loader alone cost the device plugin about
// 5 MB of binary and of idle RSS, for two requests an hour.
//
// It supports what nodes and pods use: bearer tokens (inline, a token file,
// the service account's rotating token), client certificates and CA
// bundles (files or inline data), tls-server-name and
// insecure-skip-tls-verify. Exec plugins, auth providers and basic auth
// are refused with an error that says so; a program that needs them uses
// shared/kubeclient.
package kubehttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nvinject/nvinject/shared/contract"
)

// maxBody bounds what is read of one API server answer.
const maxBody = 1 << 20

// The pod's service account as the kubelet mounts it.
const (
	ServiceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	ServiceAccountCA    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// Client sends requests to one API server.
type Client struct {
	http      *http.Client
	host      string
	userAgent string
	token     *token
}

// InCluster is where a pod finds its API server: the service's address
// (KUBERNETES_SERVICE_HOST and _PORT, which the caller reads) and the
// service account's files.
type InCluster struct {
	Host, Port        string
	TokenFile, CAFile string
}

// New returns the client of the API server kubeconfig names or, when
// kubeconfig is empty, of the pod's service account (in); program is the
// user agent.
func New(kubeconfig string, in InCluster, program string) (*Client, error) {
	var (
		c   *Client
		err error
	)
	if kubeconfig != "" {
		c, err = fromKubeconfig(kubeconfig)
	} else {
		c, err = inCluster(in)
	}
	if err != nil {
		return nil, fmt.Errorf("API server configuration (--kubeconfig=%s): %w; give a kubeconfig, or run in a pod with the %s service account (a node without kube-proxy: set KUBERNETES_SERVICE_HOST/PORT to the API server's address)", contract.Quote(kubeconfig), err, program)
	}
	c.userAgent = program
	return c, nil
}

func inCluster(in InCluster) (*Client, error) {
	if in.Host == "" || in.Port == "" {
		return nil, errors.New("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset")
	}
	if in.TokenFile == "" {
		in.TokenFile = ServiceAccountToken
	}
	if in.CAFile == "" {
		in.CAFile = ServiceAccountCA
	}
	ca, err := os.ReadFile(in.CAFile)
	if err != nil {
		return nil, fmt.Errorf("the service account's CA: %w", err)
	}
	t := &token{file: in.TokenFile}
	if _, err := t.get(); err != nil {
		return nil, err
	}
	return newClient("https://"+net.JoinHostPort(in.Host, in.Port), tlsConfig{ca: ca}, t)
}

// tlsConfig is what a kubeconfig or the service account says of TLS.
type tlsConfig struct {
	ca, cert, key []byte
	serverName    string
	insecure      bool
}

func newClient(host string, tc tlsConfig, t *token) (*Client, error) {
	u, err := url.Parse(host)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("API server address %s is not a URL such as https://10.0.0.1:6443", contract.Quote(host))
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: tc.serverName, InsecureSkipVerify: tc.insecure} //nolint:gosec // only when the kubeconfig says insecure-skip-tls-verify
	if len(tc.ca) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(tc.ca) {
			return nil, errors.New("the CA bundle holds no PEM certificate")
		}
		cfg.RootCAs = pool
	}
	if len(tc.cert) > 0 || len(tc.key) > 0 {
		pair, err := tls.X509KeyPair(tc.cert, tc.key)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     cfg,
		TLSHandshakeTimeout: 10 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 2,
		ForceAttemptHTTP2:   true,
	}
	return &Client{http: &http.Client{Transport: tr, Timeout: time.Minute}, host: strings.TrimSuffix(u.String(), "/"), token: t}, nil
}

// Host is the API server's address.
func (c *Client) Host() string { return c.host }

// Do sends one request to path (such as /api/v1/nodes/n1) with query q and,
// when body is not nil, that body of contentType; a 2xx answer is decoded
// into out (when not nil). Any other answer is a *StatusError.
func (c *Client) Do(ctx context.Context, method, path string, q url.Values, contentType string, body []byte, out any) error {
	u := c.host + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != nil {
		tok, err := c.token.get()
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("%s %s: read the answer: %w", method, u, err)
	}
	if resp.StatusCode/100 != 2 {
		return statusError(method, u, resp, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode the answer: %w", method, u, err)
	}
	return nil
}

// StatusError is an API server's answer other than 2xx: its Status object
// when it sent one, else the HTTP status and the start of the body.
type StatusError struct {
	Code    int
	Reason  string
	Message string
}

func (e *StatusError) Error() string { return e.Message }

// IsNotFound says whether err is the API server's NotFound.
func IsNotFound(err error) bool {
	var s *StatusError
	return errors.As(err, &s) && (s.Reason == "NotFound" || (s.Reason == "" && s.Code == http.StatusNotFound))
}

func statusError(method, u string, resp *http.Response, data []byte) error {
	var st struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
		Reason  string `json:"reason"`
		Code    int    `json:"code"`
	}
	if json.Unmarshal(data, &st) == nil && st.Kind == "Status" {
		if st.Code == 0 {
			st.Code = resp.StatusCode
		}
		return &StatusError{Code: st.Code, Reason: st.Reason, Message: st.Message}
	}
	return &StatusError{Code: resp.StatusCode, Message: fmt.Sprintf("%s %s: %s: %s", method, u, resp.Status, contract.Quote(string(data)))}
}

// token is a bearer token, inline or read from a file and read again a
// minute later: the service account's projected token rotates.
type token struct {
	value string
	file  string

	mu     sync.Mutex
	read   time.Time
	cached string
}

func (t *token) get() (string, error) {
	if t.file == "" {
		return t.value, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cached != "" && time.Since(t.read) < time.Minute {
		return t.cached, nil
	}
	data, err := os.ReadFile(t.file)
	if err != nil {
		if t.cached != "" {
			return t.cached, nil
		}
		return "", fmt.Errorf("bearer token: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("bearer token file %s is empty", t.file)
	}
	t.cached, t.read = tok, time.Now()
	return tok, nil
}
