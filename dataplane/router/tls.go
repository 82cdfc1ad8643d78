package router

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"

	"github.com/fastroute/fastroute/dataplane/config"
)

// certificate is the front end's TLS certificate, read again by a reload
// (a rotated certificate serves new handshakes at once; connections open
// keep theirs).
type certificate struct {
	cur atomic.Pointer[tls.Certificate]
}

// load reads the certificate and key files of t.
func (c *certificate) load(t config.TLS) error {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return fmt.Errorf("key tls: %w", err)
	}
	c.cur.Store(&cert)
	return nil
}

// serverConfig is the front end's TLS configuration: TLS 1.2 and later,
// HTTP/1.1 inside, the current certificate.
func (c *certificate) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.cur.Load(), nil
		},
	}
}
