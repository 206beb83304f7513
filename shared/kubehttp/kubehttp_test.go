package kubehttp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pki is a CA and a client certificate it signed, PEM encoded.
type pki struct {
	caPEM, certPEM, keyPEM []byte
	pool                   *x509.CertPool
}

func newPKI(t *testing.T) pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "system:node:n1"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pki{
		caPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		pool:    pool,
	}
}

// apiServer answers like the API server: the Node n1, a Status for any
// other name, and it records who asked.
type apiServer struct {
	*httptest.Server
	serverCA []byte
	seen     chan string
}

func newAPIServer(t *testing.T, clientCAs *x509.CertPool) *apiServer {
	t.Helper()
	a := &apiServer{seen: make(chan string, 16)}
	a.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := "anonymous"
		if h := r.Header.Get("Authorization"); h != "" {
			who = h
		} else if len(r.TLS.PeerCertificates) > 0 {
			who = "cert:" + r.TLS.PeerCertificates[0].Subject.CommonName
		}
		a.seen <- who + " " + r.Header.Get("User-Agent")
		switch r.URL.Path {
		case "/api/v1/nodes/n1":
			io.WriteString(w, `{"kind":"Node","metadata":{"name":"n1","uid":"u1"}}`)
		case "/api/v1/nodes/missing":
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"kind":"Status","status":"Failure","message":"nodes \"missing\" not found","reason":"NotFound","code":404}`)
		default:
			w.WriteHeader(http.StatusBadGateway)
			io.WriteString(w, strings.Repeat("<html>proxy error</html>", 1000))
		}
	}))
	a.TLS = &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: clientCAs}
	a.StartTLS()
	t.Cleanup(a.Close)
	a.serverCA = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.Certificate().Raw})
	return a
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func kubeconfigFile(t *testing.T, dir, cluster, user string) string {
	t.Helper()
	return writeFile(t, dir, "kubeconfig", []byte(`apiVersion: v1
kind: Config
current-context: x
contexts:
- name: other
  context: {cluster: nowhere, user: nobody}
- name: x
  context: {cluster: c, user: u}
clusters:
- name: c
  cluster:
`+cluster+`
users:
- name: u
  user:
`+user+`
`))
}

func uid(t *testing.T, c *Client) (string, error) {
	t.Helper()
	var node struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	err := c.Do(context.Background(), http.MethodGet, "/api/v1/nodes/n1", nil, "", nil, &node)
	return node.Metadata.UID, err
}

// Each way a kubeconfig names the server's CA and the user's credentials
// reaches the server as that user, over verified TLS.
func TestKubeconfigCredentials(t *testing.T) {
	p := newPKI(t)
	srv := newAPIServer(t, p.pool)
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	cases := []struct {
		name, cluster, user, who string
		files                    map[string][]byte
	}{
		{name: "inline token, CA data", cluster: "    server: " + srv.URL + "\n    certificate-authority-data: " + b64(srv.serverCA),
			user: "    token: t0k3n", who: "Bearer t0k3n"},
		{name: "token file and CA file relative to the kubeconfig", cluster: "    server: " + srv.URL + "\n    certificate-authority: ca.crt",
			user: "    tokenFile: token", who: "Bearer from-file", files: map[string][]byte{"ca.crt": srv.serverCA, "token": []byte("from-file\n")}},
		{name: "client certificate files", cluster: "    server: " + srv.URL + "\n    certificate-authority: ca.crt",
			user: "    client-certificate: tls.crt\n    client-key: tls.key", who: "cert:system:node:n1",
			files: map[string][]byte{"ca.crt": srv.serverCA, "tls.crt": p.certPEM, "tls.key": p.keyPEM}},
		{name: "client certificate data", cluster: "    server: " + srv.URL + "\n    certificate-authority-data: " + b64(srv.serverCA),
			user: "    client-certificate-data: " + b64(p.certPEM) + "\n    client-key-data: " + b64(p.keyPEM), who: "cert:system:node:n1"},
		{name: "insecure-skip-tls-verify", cluster: "    server: " + srv.URL + "\n    insecure-skip-tls-verify: true", user: "    token: t", who: "Bearer t"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, d := range tc.files {
				writeFile(t, dir, n, d)
			}
			c, err := New(kubeconfigFile(t, dir, tc.cluster, tc.user), InCluster{}, "kubehttp-test")
			if err != nil {
				t.Fatal(err)
			}
			if got, err := uid(t, c); err != nil || got != "u1" {
				t.Fatalf("GET Node n1: uid %q, %v", got, err)
			}
			if who := <-srv.seen; who != tc.who+" kubehttp-test" {
				t.Errorf("the server saw %q; want %q with the program as user agent", who, tc.who+" kubehttp-test")
			}
		})
	}
}

// A server whose certificate the kubeconfig's CA did not sign is refused,
// and so is what this client cannot do, each with the reason.
func TestKubeconfigRefusals(t *testing.T) {
	srv := newAPIServer(t, nil)
	b64 := base64.StdEncoding.EncodeToString(newPKI(t).caPEM)
	dir := t.TempDir()
	c, err := New(kubeconfigFile(t, dir, "    server: "+srv.URL+"\n    certificate-authority-data: "+b64, "    token: t"), InCluster{}, "kubehttp-test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := uid(t, c); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a server the CA did not sign: %v; want a certificate error", err)
	}
	cases := map[string]struct{ cluster, user, want string }{
		"exec plugin":      {"    server: " + srv.URL, "    exec: {command: aws}", "exec plugins"},
		"basic auth":       {"    server: " + srv.URL, "    username: admin", "basic auth"},
		"no server":        {"    certificate-authority-data: " + b64, "    token: t", "has no server"},
		"not a URL":        {"    server: 10.0.0.1:6443", "    token: t", "is not a URL"},
		"missing CA file":  {"    server: " + srv.URL + "\n    certificate-authority: nope.crt", "    token: t", "nope.crt"},
		"not PEM":          {"    server: " + srv.URL + "\n    certificate-authority-data: " + base64.StdEncoding.EncodeToString([]byte("junk")), "    token: t", "no PEM certificate"},
		"half a key pair":  {"    server: " + srv.URL, "    client-key-data: " + base64.StdEncoding.EncodeToString([]byte("k")), "client certificate"},
		"no token in file": {"    server: " + srv.URL, "    tokenFile: empty", "is empty"},
	}
	writeFile(t, dir, "empty", nil)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := New(kubeconfigFile(t, dir, tc.cluster, tc.user), InCluster{}, "kubehttp-test")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--kubeconfig=") {
				t.Errorf("New: %v; want an error naming --kubeconfig and %q", err, tc.want)
			}
		})
	}
	bad := writeFile(t, dir, "bad", []byte("current-context: x\ncontexts: []\n"))
	if _, err := New(bad, InCluster{}, "p"); err == nil || !strings.Contains(err.Error(), "not among its contexts") {
		t.Errorf("a current-context that is not there: %v", err)
	}
}

// In a pod: the service's address and the service account's CA and token,
// whose later rotation the client follows.
func TestInCluster(t *testing.T) {
	srv := newAPIServer(t, nil)
	u, _ := url.Parse(srv.URL)
	host, port, _ := net.SplitHostPort(u.Host)
	dir := t.TempDir()
	in := InCluster{Host: host, Port: port, CAFile: writeFile(t, dir, "ca.crt", srv.serverCA), TokenFile: writeFile(t, dir, "token", []byte("first"))}
	c, err := New("", in, "kubehttp-test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := uid(t, c); err != nil {
		t.Fatal(err)
	}
	if who := <-srv.seen; who != "Bearer first kubehttp-test" {
		t.Errorf("the server saw %q", who)
	}
	writeFile(t, dir, "token", []byte("rotated"))
	c.token.read = time.Now().Add(-2 * time.Minute)
	if _, err := uid(t, c); err != nil {
		t.Fatal(err)
	}
	if who := <-srv.seen; who != "Bearer rotated kubehttp-test" {
		t.Errorf("after rotation the server saw %q; want the new token", who)
	}
	if _, err := New("", InCluster{}, "kubehttp-test"); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST") {
		t.Errorf("outside a pod: %v; want the reason naming KUBERNETES_SERVICE_HOST", err)
	}
}

// The API server's Status comes back as a StatusError with its reason; an
// answer that is not a Status keeps the HTTP status, bounded.
func TestStatusErrors(t *testing.T) {
	srv := newAPIServer(t, nil)
	dir := t.TempDir()
	c, err := New(kubeconfigFile(t, dir, "    server: "+srv.URL+"\n    insecure-skip-tls-verify: true", "    token: t"), InCluster{}, "kubehttp-test")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	err = c.Do(ctx, http.MethodGet, "/api/v1/nodes/missing", nil, "", nil, nil)
	if !IsNotFound(err) || err.Error() != `nodes "missing" not found` {
		t.Errorf("missing Node: %v; want the server's NotFound", err)
	}
	err = c.Do(ctx, http.MethodGet, "/api/v1/nodes/behind-a-broken-proxy", nil, "", nil, nil)
	var st *StatusError
	if IsNotFound(err) || !asStatus(err, &st) || st.Code != http.StatusBadGateway || len(err.Error()) > 1024 || !strings.Contains(err.Error(), "502 Bad Gateway") {
		t.Errorf("an answer that is not a Status: %v; want a bounded error with the HTTP status", err)
	}
}

func asStatus(err error, st **StatusError) bool {
	s, ok := err.(*StatusError)
	*st = s
	return ok
}
