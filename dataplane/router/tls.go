package router

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/internal/tlsfiles"
)

// tlsState is what the config's TLS files hold, as the router uses them:
// read by the check a start begins with, and again (what a reload
// applies) by a reload.
type tlsState struct {
	cert      frontTLS    // the front end's, with tls set
	adminCert certificate // the admin listener's, with admin_tls set
	// adminServer is the configuration each handshake of the admin
	// listener gets (admin_tls as read last; nil: the listener speaks
	// plain HTTP), and peerRoots the CAs peers' certificates are checked
	// against (nil: the system's), as read last; reloads write it, one at
	// a time.
	adminServer atomic.Pointer[tls.Config]
	peerRoots   *x509.CertPool
	workerCert  certificate // worker_tls's client certificate
	workerTLS   *tls.Config // of every connection to an https:// worker
}

// shown returns the certificates the router shows, as read last, by the
// config key that names each (Shown): what fastroute check lists and the
// expiry metrics give. One without its parsed leaf (GODEBUG
// x509keypairleaf=0) is left out.
func (ts *tlsState) shown() []Shown {
	var front *tls.Certificate
	if fc := ts.cert.cur.Load(); fc != nil {
		front = &fc.conf.Certificates[0]
	}
	var out []Shown
	for _, c := range [...]struct {
		key  string
		cert *tls.Certificate
	}{{"tls", front}, {"admin_tls", ts.adminCert.cur.Load()}, {"worker_tls", ts.workerCert.cur.Load()}} {
		if c.cert != nil && c.cert.Leaf != nil {
			out = append(out, Shown{c.key, c.cert.Leaf})
		}
	}
	return out
}

// certificate is a certificate read again by a reload (nil: none):
// worker_tls's client certificate, or the admin listener's. A rotated
// certificate serves new handshakes at once; connections open keep theirs.
type certificate struct {
	cur atomic.Pointer[tls.Certificate]
}

// adminHandshakeConfig is the configuration of the admin listener's
// handshakes (admin_tls): TLS min (a crypto/tls version) and later,
// HTTP/2 or HTTP/1.1 inside, the certificate read last, and with clientCAs
// (admin_tls.client_ca_file) a client certificate they signed required of
// every client.
func (c *certificate) adminHandshakeConfig(min uint16, clientCAs *x509.CertPool) *tls.Config {
	conf := &tls.Config{
		MinVersion:     min,
		NextProtos:     []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil },
	}
	if clientCAs != nil {
		conf.ClientCAs, conf.ClientAuth = clientCAs, tls.RequireAndVerifyClientCert
	}
	return conf
}

// adminListenerConfig is the configuration the admin listener's TLS
// connections take: each handshake gets adminServer as read last (a reload
// may change its version, its client CAs or whether it asks for a
// certificate at all), and fails once admin_tls is off.
func (ts *tlsState) adminListenerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			if conf := ts.adminServer.Load(); conf != nil {
				return conf, nil
			}
			return nil, errAdminTLSOff
		},
	}
}

var errAdminTLSOff = errors.New("admin_tls is off")

// adminListener is the admin listener: a connection it accepts speaks TLS
// while admin_tls is on (adminServer set) as it is accepted, plain HTTP
// otherwise; net/http serves both (a TLS one over HTTP/2 or HTTP/1.1).
type adminListener struct {
	net.Listener
	ts   *tlsState
	conf *tls.Config // adminListenerConfig
}

// Accept returns the next connection, as TLS while admin_tls is on.
func (l adminListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || l.ts.adminServer.Load() == nil {
		return c, err
	}
	return tls.Server(c, l.conf), nil
}

// useAdminTLS makes files, read from t, what the admin listener's next
// handshakes (none while t is off: its connections speak plain HTTP) and
// the router's next connections to peers use.
func (ts *tlsState) useAdminTLS(t config.AdminTLS, files adminFiles) {
	ts.adminCert.cur.Store(files.cert)
	if t.On() {
		ts.adminServer.Store(ts.adminCert.adminHandshakeConfig(config.TLSVersion(t.MinVersion), files.clientCAs))
	} else {
		ts.adminServer.Store(nil)
	}
	ts.peerRoots = files.peerRoots
}

// peerConfig is the configuration of posts to https:// peer replicas:
// their certificates checked against roots (nil: the system's), and this
// admin listener's certificate, as read last, shown to a peer that asks
// for one (its admin_tls.client_ca_file); none without admin_tls.
func (c *certificate) peerConfig(roots *x509.CertPool) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, GetClientCertificate: c.show}
}

// show is the certificate a client shows a server that asks for one: c's,
// as read last, or none (the server decides).
func (c *certificate) show(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if cert := c.cur.Load(); cert != nil {
		return cert, nil
	}
	return &tls.Certificate{}, nil
}

// adminFiles is what admin_tls's files hold: the admin listener's
// certificate (nil: none), the CAs peer replicas' certificates are
// checked against (nil: the system's roots), and those its clients'
// certificates must be signed by (nil: none asked for).
type adminFiles struct {
	cert                 *tls.Certificate
	peerRoots, clientCAs *x509.CertPool
}

// readAdminTLS reads admin_tls's files.
func readAdminTLS(t config.AdminTLS) (files adminFiles, err error) {
	if t.On() {
		if files.cert, err = tlsfiles.Pair("key admin_tls", t.CertFile, t.KeyFile); err != nil {
			return adminFiles{}, err
		}
	}
	if t.PeerCAFile != "" {
		if files.peerRoots, err = tlsfiles.Roots("key admin_tls.peer_ca_file", t.PeerCAFile); err != nil {
			return adminFiles{}, err
		}
	}
	if t.ClientCAFile != "" {
		if files.clientCAs, err = tlsfiles.Roots("key admin_tls.client_ca_file", t.ClientCAFile); err != nil {
			return adminFiles{}, err
		}
	}
	return files, nil
}

// applyAdminTLS makes files, read from t (the running config's was old),
// what the admin listener's next handshakes and the next posts to peers
// use, and says what changed. The caller holds reloadMu.
func (r *Router) applyAdminTLS(old, t config.AdminTLS, files adminFiles) (applied []string) {
	if r.PrefixShare != nil && !files.peerRoots.Equal(r.peerRoots) {
		r.PrefixShare.SetTLS(r.adminCert.peerConfig(files.peerRoots))
	}
	r.useAdminTLS(t, files)
	switch {
	case t.On() && !old.On():
		applied = append(applied, "admin_tls on: the admin listener's next connections speak TLS")
	case !t.On() && old.On():
		applied = append(applied, "admin_tls off: the admin listener's next connections speak plain HTTP")
	case t.On():
		applied = append(applied, "admin_tls certificate read again")
	}
	if t.On() {
		if t.MinVersion != old.MinVersion {
			applied = append(applied, fmt.Sprintf("admin_tls.min_version=%q", t.MinVersion))
		}
	}
	switch {
	case t.ClientCAFile != "":
		applied = append(applied, fmt.Sprintf("admin_tls.client_ca_file=%q read again", t.ClientCAFile))
	case old.ClientCAFile != "":
		applied = append(applied, "admin_tls.client_ca_file dropped: no client certificate asked")
	}
	switch {
	case t.PeerCAFile != "":
		applied = append(applied, fmt.Sprintf("admin_tls.peer_ca_file=%q read again", t.PeerCAFile))
	case old.PeerCAFile != "":
		applied = append(applied, "admin_tls.peer_ca_file dropped: peers' certificates checked against the system's roots")
	}
	return applied
}

// applyWorkerTLS makes cert, read from t (the running config's was old),
// the client certificate the next connections to workers show, and conf
// (nil: as it is) their configuration: the front end's, the health
// probes' and the engine scrapes'. It says what changed. The caller holds
// reloadMu.
func (r *Router) applyWorkerTLS(old, t config.WorkerTLS, cert *tls.Certificate, conf *tls.Config) (applied []string) {
	switch {
	case cert != nil:
		applied = append(applied, "worker_tls client certificate read again")
	case old.CertFile != "":
		applied = append(applied, "worker_tls client certificate dropped")
	}
	r.workerCert.cur.Store(cert)
	if conf == nil {
		return applied
	}
	r.workerTLS = conf
	r.Frontend.SetWorkerTLS(conf)
	r.Health.SetTLS(conf)
	if l := r.engines.Load(); l != nil {
		l.SetTLS(conf)
	}
	if t.CAFile != "" {
		applied = append(applied, fmt.Sprintf("worker_tls.ca_file=%q read again", t.CAFile))
	} else if old.CAFile != "" {
		applied = append(applied, "worker_tls.ca_file dropped: workers' certificates checked against the system's roots")
	}
	if t.ServerName != old.ServerName {
		applied = append(applied, fmt.Sprintf("worker_tls.server_name=%q", t.ServerName))
	}
	if t.InsecureSkipVerify != old.InsecureSkipVerify {
		applied = append(applied, fmt.Sprintf("worker_tls.insecure_skip_verify=%v", t.InsecureSkipVerify))
		if t.InsecureSkipVerify {
			r.log.Warn("worker_tls.insecure_skip_verify: https:// workers' certificates are not checked")
		}
	}
	return applied
}

// frontTLS is the front end's TLS configuration, read again by a reload:
// its certificate, and with tls.client_ca_file the CAs whose certificate
// every client must show (mutual TLS), checked against tls.client_crl_file's
// revocation lists when set. New handshakes get what the last read gave;
// connections open keep theirs.
type frontTLS struct {
	cur atomic.Pointer[frontConfig]
	// refused counts the handshakes the revocation lists refused, by
	// reason (crlReasons), across reloads.
	refused [len(crlReasons)]atomic.Int64
}

// frontConfig is one reading of the front end's TLS files: the
// configuration handshakes get, and the revocation lists it checks
// clients' chains against (nil: none).
type frontConfig struct {
	conf *tls.Config
	crls *tlsfiles.Revocations
}

// crlReasons are the reasons a client's certificate chain is refused for
// by the revocation lists, as fastroute_tls_client_crl_refusals_total
// labels them.
var crlReasons = [...]string{tlsfiles.Revoked, tlsfiles.NoCRL, tlsfiles.CRLOutdated, tlsfiles.CRLSignature}

// read reads t's files into a configuration: TLS t.MinVersion and later,
// HTTP/1.1 inside, t's certificate, and a client certificate checked
// against t's client CAs when t names them, required unless t's
// client_auth is optional, and against t's revocation lists when t names
// them (at every handshake, a resumed session's included: one resumed
// after a reload that revoked its certificate is refused;
// revocationCheck).
func (f *frontTLS) read(t config.TLS, log *slog.Logger) (*frontConfig, error) {
	cert, err := tlsfiles.Pair("key tls", t.CertFile, t.KeyFile)
	if err != nil {
		return nil, err
	}
	conf := &tls.Config{MinVersion: config.TLSVersion(t.MinVersion), NextProtos: []string{"http/1.1"}, Certificates: []tls.Certificate{*cert}}
	fc := &frontConfig{conf: conf}
	if t.ClientCAFile == "" {
		return fc, nil
	}
	cas, err := tlsfiles.Certificates("key tls.client_ca_file", t.ClientCAFile)
	if err != nil {
		return nil, err
	}
	conf.ClientCAs = tlsfiles.Pool(cas)
	conf.ClientAuth = tls.RequireAndVerifyClientCert
	if t.ClientAuth == config.ClientAuthOptional {
		conf.ClientAuth = tls.VerifyClientCertIfGiven
	}
	if t.ClientCRLFile != "" {
		if fc.crls, err = tlsfiles.ReadRevocations("key tls.client_crl_file", t.ClientCRLFile, cas); err != nil {
			return nil, err
		}
		conf.VerifyConnection = f.revocationCheck(fc.crls, t.ClientCRLFile, log)
	}
	return fc, nil
}

// revocationCheck returns the check of each handshake against crls, read
// from crlFile: f counts its refusals, and the first refused for a fault
// of the lists is logged on log, once a reason. A list already out of
// date is logged now.
func (f *frontTLS) revocationCheck(crls *tlsfiles.Revocations, crlFile string, log *slog.Logger) func(tls.ConnectionState) error {
	for _, issuer := range crls.Expired(time.Now()) {
		log.Warn("tls.client_crl_file: a revocation list is out of date; every client certificate its issuer signed is refused until a current one is read (SIGHUP)",
			"file", crlFile, "issuer", issuer)
	}
	var warned [len(crlReasons)]atomic.Bool
	return func(cs tls.ConnectionState) error {
		err := crls.Check(cs.VerifiedChains, time.Now())
		var refusal *tlsfiles.RefusalError
		if !errors.As(err, &refusal) {
			return err
		}
		if i := slices.Index(crlReasons[:], refusal.Reason); i >= 0 {
			f.refused[i].Add(1)
			// A revoked client is the lists at work; a missing, out of
			// date or forged list refuses every client of its issuer
			// until the file is fixed and read again.
			if refusal.Reason != tlsfiles.Revoked && !warned[i].Swap(true) {
				log.Warn("tls.client_crl_file: a client refused for a fault of the revocation lists; every client of that issuer is until a good list is read (SIGHUP)",
					"file", crlFile, "reason", refusal.Reason, "err", err)
			}
		}
		return err
	}
}

// load reads t's files (read) into the configuration new handshakes get.
func (f *frontTLS) load(t config.TLS, log *slog.Logger) error {
	fc, err := f.read(t, log)
	if err != nil {
		return err
	}
	f.cur.Store(fc)
	return nil
}

// serverConfig is the configuration the front end's listener takes: each
// handshake gets the one last read (none once a reload turned TLS off: a
// connection accepted before, its handshake still to come, is refused).
func (f *frontTLS) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			if fc := f.cur.Load(); fc != nil {
				return fc.conf, nil
			}
			return nil, errListenerTLSOff
		},
	}
}

var errListenerTLSOff = errors.New("tls is off: the listener speaks plain HTTP")

// applyListenerTLS makes fc, read from t (nil: t turns TLS off), what the
// front end's next handshakes get, turning the listener's TLS on or off
// for the connections accepted from then on (the old config was old), and
// says what changed. The caller holds reloadMu.
func (r *Router) applyListenerTLS(old, t config.TLS, fc *frontConfig) (applied []string) {
	r.cert.cur.Store(fc)
	switch {
	case fc == nil && old.On():
		r.Frontend.SetListenerTLS(nil)
		return []string{"tls off: the connections accepted from now on speak plain HTTP"}
	case fc == nil:
		return nil
	case !old.On():
		r.Frontend.SetListenerTLS(r.cert.serverConfig())
		applied = append(applied, "tls on: the connections accepted from now on speak TLS")
	default:
		applied = append(applied, "tls certificate read again")
	}
	if t.MinVersion != old.MinVersion {
		applied = append(applied, fmt.Sprintf("tls.min_version=%q", t.MinVersion))
	}
	if t.ClientCAFile != "" {
		applied = append(applied, fmt.Sprintf("tls.client_ca_file=%q read again", t.ClientCAFile))
		if t.ClientAuth != old.ClientAuth {
			applied = append(applied, fmt.Sprintf("tls.client_auth=%q", t.ClientAuth))
		}
		if crls := fc.crls; crls != nil {
			applied = append(applied, fmt.Sprintf("tls.client_crl_file=%q read again (lists of %d issuers, revoked: %d)",
				t.ClientCRLFile, crls.Issuers(), crls.Revoked()))
		} else if old.ClientCRLFile != "" {
			applied = append(applied, "tls.client_crl_file dropped: no revocation checked")
		}
	} else if old.ClientCAFile != "" {
		applied = append(applied, "tls.client_ca_file dropped: no client certificate asked")
	}
	return applied
}

// readClientCertificate reads t's certificate and key files, or nothing
// when t names none.
func readClientCertificate(t config.WorkerTLS) (*tls.Certificate, error) {
	if t.CertFile == "" {
		return nil, nil
	}
	return tlsfiles.Pair("key worker_tls", t.CertFile, t.KeyFile)
}

// workerConfig is the TLS configuration of connections to https://
// workers (worker_tls): TLS 1.2 and later, HTTP/1.1 inside, certificates
// checked against t's roots (else the system's) for t's server name (else
// each connection's host, set by its dialer), the current client
// certificate shown to a worker that asks for one, and sessions resumed
// across a worker's connections (nginx's proxy_ssl_session_reuse; the
// front end gives each worker a cache of its own).
func (c *certificate) workerConfig(t config.WorkerTLS) (*tls.Config, error) {
	conf := &tls.Config{
		MinVersion:           tls.VersionTLS12,
		NextProtos:           []string{"http/1.1"},
		ServerName:           t.ServerName,
		InsecureSkipVerify:   t.InsecureSkipVerify,
		ClientSessionCache:   tls.NewLRUClientSessionCache(0),
		GetClientCertificate: c.show,
	}
	if t.CAFile != "" {
		roots, err := tlsfiles.Roots("key worker_tls.ca_file", t.CAFile)
		if err != nil {
			return nil, err
		}
		conf.RootCAs = roots
	}
	return conf, nil
}

// startWorkerTLS reads worker_tls's files into the configuration of
// connections to https:// workers.
func (ts *tlsState) startWorkerTLS(t config.WorkerTLS, log *slog.Logger) error {
	cert, err := readClientCertificate(t)
	if err != nil {
		return err
	}
	ts.workerCert.cur.Store(cert)
	if ts.workerTLS, err = ts.workerCert.workerConfig(t); err != nil {
		return err
	}
	if t.InsecureSkipVerify {
		log.Warn("worker_tls.insecure_skip_verify: https:// workers' certificates are not checked")
	}
	return nil
}
