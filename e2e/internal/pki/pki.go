// Package pki issues the certificates and keys a throwaway local control plane needs,
// with Go's crypto so the node depends on no openssl invocation.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// validity is long enough for any test run and short enough to never matter outside one.
const validity = 365 * 24 * time.Hour

// CA signs the node's certificates.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// CertFile and KeyFile are where the CA was written.
	CertFile, KeyFile string
}

// Request describes one certificate to issue.
type Request struct {
	// Name is the file base name: <Name>.crt and <Name>.key.
	Name         string
	CommonName   string
	Organization []string
	DNSNames     []string
	IPs          []net.IP
	Server       bool
	Client       bool
	// Dir is where to write it; default next to the CA.
	Dir string
}

// Pair is an issued certificate on disk.
type Pair struct{ CertFile, KeyFile string }

// NewCA creates a self-signed CA in dir, written as ca.crt and ca.key.
func NewCA(dir, commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse CA: %w", err)
	}
	ca := &CA{Cert: cert, Key: key, CertFile: filepath.Join(dir, "ca.crt"), KeyFile: filepath.Join(dir, "ca.key")}
	if err := writePair(ca.CertFile, ca.KeyFile, der, key); err != nil {
		return nil, err
	}
	return ca, nil
}

// Issue signs a certificate for req and writes it next to the CA.
func (ca *CA) Issue(req Request) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, fmt.Errorf("generate key for %s: %w", req.Name, err)
	}
	var usage []x509.ExtKeyUsage
	if req.Server {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	if req.Client {
		usage = append(usage, x509.ExtKeyUsageClientAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: req.CommonName, Organization: req.Organization},
		DNSNames:     req.DNSNames,
		IPAddresses:  req.IPs,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return Pair{}, fmt.Errorf("sign %s: %w", req.Name, err)
	}
	dir := req.Dir
	if dir == "" {
		dir = filepath.Dir(ca.CertFile)
	}
	p := Pair{CertFile: filepath.Join(dir, req.Name+".crt"), KeyFile: filepath.Join(dir, req.Name+".key")}
	return p, writePair(p.CertFile, p.KeyFile, der, key)
}

// WriteKeyPair writes a bare key pair (service-account signing) as <name>.key and <name>.pub.
func WriteKeyPair(dir, name string) (priv, pub string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("generate %s key: %w", name, err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("marshal %s public key: %w", name, err)
	}
	priv, pub = filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
	if err := writeKey(priv, key); err != nil {
		return "", "", err
	}
	return priv, pub, writePEM(pub, "PUBLIC KEY", pubDER, 0o644)
}

func writePair(certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writeKey(keyFile, key)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("marshal key %s: %w", path, err)
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return n
}
