package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
)

func TestIssueVerifiesAgainstCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA(dir, "test-ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(Request{Name: "srv", CommonName: "srv", Server: true,
		DNSNames: []string{"node-a"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, name := range []string{"node-a", "127.0.0.1"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
}
