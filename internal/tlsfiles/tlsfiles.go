// Package tlsfiles reads the PEM files TLS is configured with: CA
// certificates to trust, and a certificate chain with its private key.
// Errors name the config key and the file, never what the file holds.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Roots reads caFile's PEM certificates into a pool; key is the config key
// that named the file, for errors.
func Roots(key, caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", key, caFile)
	}
	return pool, nil
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
