package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's credentials, as files under dir: a CA; the
// apiserver's serving certificate; its client certificate for the
// kubelet (which trusts the CA's clients alone); the service account
// signing key; and the static tokens of the admin and the kubelet.
type pki struct {
	dir                      string
	caCert, caKey            string
	serverCert, serverKey    string
	kubeletClientCert, kcKey string
	saKey, saPub             string
	tokens                   string
	adminToken, kubeletToken string
	caPEM                    []byte
}

// newPKI writes the cluster's credentials into dir. The keys are ECDSA
// P-256: every component takes them, and they are made in milliseconds
// (RSA-2048's four take a second or two on these machines).
func newPKI(dir string, serviceIP net.IP) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{dir: dir}
	f := func(n string) string { return filepath.Join(dir, n) }
	p.caCert, p.caKey = f("ca.crt"), f("ca.key")
	p.serverCert, p.serverKey = f("apiserver.crt"), f("apiserver.key")
	p.kubeletClientCert, p.kcKey = f("apiserver-kubelet-client.crt"), f("apiserver-kubelet-client.key")
	p.saKey, p.saPub = f("sa.key"), f("sa.pub")
	p.tokens = f("tokens.csv")

	now := time.Now().Add(-time.Hour) // a clock a little behind still trusts it
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "tai42-kubetest-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	p.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if err := writeCertKey(p.caCert, p.caKey, caDER, caKey); err != nil {
		return nil, err
	}
	leaf := func(cn string, orgs []string, usage x509.ExtKeyUsage, ips []net.IP, dns []string, cert, key string) error {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: cn, Organization: orgs},
			NotBefore:    now,
			NotAfter:     now.Add(30 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			return err
		}
		return writeCertKey(cert, key, der, k)
	}
	if err := leaf("kube-apiserver", nil, x509.ExtKeyUsageServerAuth,
		[]net.IP{net.IPv4(127, 0, 0, 1), serviceIP},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		p.serverCert, p.serverKey); err != nil {
		return nil, err
	}
	if err := leaf("kube-apiserver-kubelet-client", []string{"system:masters"}, x509.ExtKeyUsageClientAuth, nil, nil,
		p.kubeletClientCert, p.kcKey); err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	if err := writeKey(p.saKey, saKey); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		return nil, err
	}
	p.adminToken, p.kubeletToken = token(), token()
	// token,user,uid,"group1,group2": the kubelet is system:node:localhost
	// in system:nodes (the Node authorizer's and NodeRestriction's user).
	tokens := fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,system:node:localhost,kubelet,\"system:nodes\"\n", p.adminToken, p.kubeletToken)
	if err := os.WriteFile(p.tokens, []byte(tokens), 0o600); err != nil {
		return nil, err
	}
	return p, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

func token() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func writeKey(file string, k *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return err
	}
	return os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func writeCertKey(cert, key string, der []byte, k *ecdsa.PrivateKey) error {
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return writeKey(key, k)
}
