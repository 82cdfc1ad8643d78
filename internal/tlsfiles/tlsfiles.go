// Package tlsfiles reads the PEM files TLS is configured with: CA
// certificates to trust, a certificate chain with its private key, and
// certificate revocation lists (CRLs), against which it checks a client's
// verified certificate chains. Errors name the config key and the file,
// never what the file holds.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
)

// Roots reads caFile's PEM certificates into a pool; key is the config key
// that named the file, for errors.
func Roots(key, caFile string) (*x509.CertPool, error) {
	certs, err := Certificates(key, caFile)
	if err != nil {
		return nil, err
	}
	return Pool(certs), nil
}

// Pool is a pool of certs.
func Pool(certs []*x509.Certificate) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool
}

// Certificates reads file's PEM certificates (blocks of another type are
// skipped, as x509.CertPool.AppendCertsFromPEM skips them); key is the
// config key that named the file, for errors.
func Certificates(key, file string) ([]*x509.Certificate, error) {
	data, err := readFile(key, file)
	if err != nil {
		return nil, err
	}
	var certs []*x509.Certificate
	for _, der := range pemBlocks(data, "CERTIFICATE") {
		// A block that does not parse is skipped, as AppendCertsFromPEM
		// skips it.
		if c, err := x509.ParseCertificate(der); err == nil {
			certs = append(certs, c)
		}
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", key, file)
	}
	return certs, nil
}

// readFile reads file; key is the config key that named it, for errors.
func readFile(key, file string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return data, nil
}

// pemBlocks returns the bytes of data's PEM blocks of type typ (without
// headers, as x509.CertPool.AppendCertsFromPEM takes them).
func pemBlocks(data []byte, typ string) [][]byte {
	var blocks [][]byte
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return blocks
		}
		if b.Type == typ && len(b.Headers) == 0 {
			blocks = append(blocks, b.Bytes)
		}
	}
}

// Pair reads a PEM certificate chain and its private key; key is the
// config key that named them, for errors.
func Pair(key, certFile, keyFile string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return &cert, nil
}
