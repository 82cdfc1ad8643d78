// Package testpki makes a small public-key infrastructure for a test: a
// root certificate authority, intermediate CAs and the client and server
// certificates they sign, and the certificate revocation lists (CRLs)
// they issue, written as PEM files where a config names files.
package testpki

import (
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
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Authority is a CA: its certificate and its key.
type Authority struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	tb   testing.TB
}

// Root is a self-signed CA named name, valid an hour either side of now.
func Root(tb testing.TB, name string) *Authority {
	tb.Helper()
	key := NewKey(tb)
	tmpl := template(name, 1, true)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(tb, err)
	return &Authority{Cert: parse(tb, der), key: key, tb: tb}
}

// Intermediate is a CA named name that a signs, of serial number serial.
func (a *Authority) Intermediate(name string, serial int64) *Authority {
	a.tb.Helper()
	key := NewKey(a.tb)
	der, err := x509.CreateCertificate(rand.Reader, template(name, serial, true), a.Cert, &key.PublicKey, a.key)
	require.NoError(a.tb, err)
	return &Authority{Cert: parse(a.tb, der), key: key, tb: a.tb}
}

// TwoTier is a two-tier PKI: a root, an issuing CA it signs (serial 100),
// two clients the issuing CA signs (Alice, serial 20, and Bob, 21) and one
// the root signs itself (Carol, 22).
type TwoTier struct {
	Root, Issuing     *Authority
	Alice, Bob, Carol *Leaf
}

// NewTwoTier makes a TwoTier of CAs named root and issuing.
func NewTwoTier(tb testing.TB, root, issuing string) TwoTier {
	tb.Helper()
	p := TwoTier{Root: Root(tb, root)}
	p.Issuing = p.Root.Intermediate(issuing, 100)
	p.Alice = p.Issuing.Client("alice", 20, p.Issuing)
	p.Bob = p.Issuing.Client("bob", 21, p.Issuing)
	p.Carol = p.Root.Client("carol", 22)
	return p
}

// Leaf is a client or server certificate and its key, as PEM, and the chain it is
// shown with (the intermediate CAs between it and its root), leaf first.
type Leaf struct {
	Cert    *x509.Certificate
	CertPEM []byte // the certificate, then the intermediates of its chain
	KeyPEM  []byte
	Chain   []*x509.Certificate // the certificate, then its intermediates
	Serial  int64
	tb      testing.TB
}

// Client is a client certificate named name that a signs, of serial
// number serial, valid an hour either side of now; the intermediates of
// its chain follow it in CertPEM.
func (a *Authority) Client(name string, serial int64, intermediates ...*Authority) *Leaf {
	a.tb.Helper()
	return a.ClientUntil(name, serial, time.Now().Add(time.Hour), intermediates...)
}

// ClientUntil is Client valid until notAfter (from two hours before it).
func (a *Authority) ClientUntil(name string, serial int64, notAfter time.Time, intermediates ...*Authority) *Leaf {
	a.tb.Helper()
	tmpl := template(name, serial, false)
	tmpl.NotBefore, tmpl.NotAfter = notAfter.Add(-2*time.Hour), notAfter
	return a.sign(tmpl, intermediates)
}

// Server is a server certificate for loopback (127.0.0.1, ::1 and
// localhost) named name that a signs, of serial number serial, valid an
// hour either side of now; it serves as a client certificate too.
func (a *Authority) Server(name string, serial int64) *Leaf {
	a.tb.Helper()
	tmpl := template(name, serial, false)
	tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	tmpl.IPAddresses, tmpl.DNSNames = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, []string{"localhost"}
	return a.sign(tmpl, nil)
}

// sign makes the leaf of tmpl that a signs, with a key of its own.
func (a *Authority) sign(tmpl *x509.Certificate, intermediates []*Authority) *Leaf {
	a.tb.Helper()
	key := NewKey(a.tb)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.Cert, &key.PublicKey, a.key)
	require.NoError(a.tb, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(a.tb, err)
	l := &Leaf{Cert: parse(a.tb, der), Serial: tmpl.SerialNumber.Int64(), tb: a.tb,
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}
	l.Chain = []*x509.Certificate{l.Cert}
	l.CertPEM = CertPEM(l.Cert)
	for _, i := range intermediates {
		l.Chain = append(l.Chain, i.Cert)
		l.CertPEM = append(l.CertPEM, CertPEM(i.Cert)...)
	}
	return l
}

// Pair is l as a certificate a TLS client shows: its chain and key.
func (l *Leaf) Pair() tls.Certificate {
	l.tb.Helper()
	pair, err := tls.X509KeyPair(l.CertPEM, l.KeyPEM)
	require.NoError(l.tb, err)
	return pair
}

// Files writes l's certificate chain and key to a new directory and
// returns their paths.
func (l *Leaf) Files() (certFile, keyFile string) {
	l.tb.Helper()
	dir := l.tb.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(l.tb, os.WriteFile(certFile, l.CertPEM, 0o600))
	require.NoError(l.tb, os.WriteFile(keyFile, l.KeyPEM, 0o600))
	return certFile, keyFile
}

// CRL is a revocation list a issues, valid from thisUpdate to nextUpdate
// (zero: no nextUpdate), revoking the serial numbers serials; DER.
func (a *Authority) CRL(thisUpdate, nextUpdate time.Time, serials ...int64) []byte {
	a.tb.Helper()
	return a.CRLSignedBy(a.key, thisUpdate, nextUpdate, serials...)
}

// CRLSignedBy is a revocation list in a's name that another key signed: a
// forgery, which its checks must refuse.
func (a *Authority) CRLSignedBy(key *ecdsa.PrivateKey, thisUpdate, nextUpdate time.Time, serials ...int64) []byte {
	a.tb.Helper()
	tmpl := &x509.RevocationList{Number: big.NewInt(thisUpdate.Unix()), ThisUpdate: thisUpdate, NextUpdate: nextUpdate}
	for _, s := range serials {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries,
			x509.RevocationListEntry{SerialNumber: big.NewInt(s), RevocationTime: thisUpdate})
	}
	issuer := *a.Cert
	issuer.PublicKey = &key.PublicKey
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, &issuer, key)
	require.NoError(a.tb, err)
	return der
}

// CRLPEM is der as a PEM block.
func CRLPEM(der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}) }

// CertPEM is c as a PEM block.
func CertPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// WriteFile writes the concatenation of parts to a new file of tb's and
// returns its path.
func WriteFile(tb testing.TB, name string, parts ...[]byte) string {
	tb.Helper()
	var data []byte
	for _, p := range parts {
		data = append(data, p...)
	}
	path := filepath.Join(tb.TempDir(), name)
	require.NoError(tb, os.WriteFile(path, data, 0o600))
	return path
}

// NewKey is a fresh P-256 key.
func NewKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	return key
}

func template(name string, serial int64, ca bool) *x509.Certificate {
	t := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true, IsCA: ca,
	}
	if ca {
		t.KeyUsage |= x509.KeyUsageCertSign | x509.KeyUsageCRLSign
		t.ExtKeyUsage = nil
	}
	return t
}

func parse(tb testing.TB, der []byte) *x509.Certificate {
	tb.Helper()
	c, err := x509.ParseCertificate(der)
	require.NoError(tb, err)
	return c
}
