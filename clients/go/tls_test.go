package snowkeep

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
)

type pki struct {
	dir        string
	ca         *x509.Certificate
	caKey      *ecdsa.PrivateKey
	caPool     *x509.CertPool
	serverPair tls.Certificate
}

// issue makes a certificate signed by the CA (or self-signed when ca is
// nil) and writes it and its key as PEM files named name.pem, name-key.pem.
func (p *pki) issue(t *testing.T, name string, isCA bool, usage x509.ExtKeyUsage) (*x509.Certificate, *ecdsa.PrivateKey, tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: isCA, BasicConstraintsValid: true, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
	}
	parent, signer := tmpl, key
	if p.ca != nil {
		parent, signer = p.ca, p.caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	_ = os.WriteFile(filepath.Join(p.dir, name+".pem"), certPEM, 0o600)
	_ = os.WriteFile(filepath.Join(p.dir, name+"-key.pem"), keyPEM, 0o600)
	cert, _ := x509.ParseCertificate(der)
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, pair
}

func newPKI(t *testing.T) *pki {
	p := &pki{dir: t.TempDir()}
	p.ca, p.caKey, _ = p.issue(t, "ca", true, x509.ExtKeyUsageAny)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(p.ca)
	_, _, p.serverPair = p.issue(t, "server", false, x509.ExtKeyUsageServerAuth)
	p.issue(t, "client", false, x509.ExtKeyUsageClientAuth)
	return p
}

func (p *pki) file(name string) string { return filepath.Join(p.dir, name) }

func TestTLSWithACAFile(t *testing.T) {
	p := newPKI(t)
	f := newTLSFake(t, 0, credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{p.serverPair}}))
	c := mustNew(t, []string{"https://" + f.addr}, WithTLS(TLSConfig{CAFile: p.file("ca.pem")}),
		WithAPIKey("k.s"))
	ids, err := c.NextIDs(context.Background(), 2)
	if err != nil || !slices.Equal(ids, seq(0, 1, 2)) || !slices.Equal(f.auth, []string{"Bearer k.s"}) {
		t.Fatalf("%v %v %v", ids, err, f.auth)
	}
	// Without the CA the handshake fails: UNAVAILABLE after the budget.
	c2 := mustNew(t, []string{"https://" + f.addr}, WithRetryBudget(time.Second), WithBackoff(time.Millisecond, 4*time.Millisecond))
	_, err = c2.NextIDs(context.Background(), 1)
	wantCode(t, err, codes.Unavailable, "handshake")
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	f := newTLSFake(t, 0, credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.serverPair}, ClientCAs: p.caPool,
		ClientAuth: tls.RequireAndVerifyClientCert,
	}))
	c := mustNew(t, []string{"https://" + f.addr}, WithTLS(TLSConfig{CAFile: p.file("ca.pem"),
		CertFile: p.file("client.pem"), KeyFile: p.file("client-key.pem")}))
	ids, err := c.NextIDs(context.Background(), 3)
	if err != nil || !slices.Equal(ids, seq(0, 1, 3)) {
		t.Fatalf("%v %v", ids, err)
	}
	_, err = New([]string{"https://" + f.addr}, WithTLS(TLSConfig{CAFile: p.file("ca.pem"),
		CertFile: p.file("client.pem"), KeyFile: p.file("server-key.pem")}))
	wantCode(t, err, codes.InvalidArgument, "tls.cert")
}
