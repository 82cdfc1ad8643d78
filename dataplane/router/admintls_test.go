package router

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/internal/testpki"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// adminTLS is the admin_tls of a certificate for 127.0.0.1 written to a
// new directory, and a pool that trusts it.
func adminTLS(t *testing.T) (config.AdminTLS, *x509.CertPool) {
	files, pool := writeCert(t, t.TempDir(), 7)
	return config.AdminTLS{CertFile: files.CertFile, KeyFile: files.KeyFile}, pool
}

// adminTLSDo sends method path to f's admin listener over TLS, trusting
// pool, with token (none: ""), and returns the status, the page and the
// serial number of the certificate the listener showed; an error when the
// handshake or the request failed.
func adminTLSDo(t *testing.T, f *fleet, pool *x509.CertPool, method, path, token string) (int, string, string, error) {
	t.Helper()
	return adminTLSDoAs(t, f, pool, nil, method, path, token)
}

// adminTLSDoAs is adminTLSDo from a client that shows cert (nil: none).
func adminTLSDoAs(t *testing.T, f *fleet, pool *x509.CertPool, cert *tls.Certificate, method, path, token string) (int, string, string, error) {
	t.Helper()
	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		conf.Certificates = []tls.Certificate{*cert}
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: conf}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest(method, "https://"+f.r.AdminAddr()+path, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	return resp.StatusCode, readAll(t, resp), resp.TLS.PeerCertificates[0].SerialNumber.String(), nil
}

// adminGet GETs path from f's admin listener over TLS (adminTLSDo), with
// no token, and returns the status and the certificate's serial number.
func adminGet(t *testing.T, f *fleet, pool *x509.CertPool, path string) (int, string, error) {
	t.Helper()
	code, _, serial, err := adminTLSDo(t, f, pool, http.MethodGet, path, "")
	return code, serial, err
}

// With admin_tls the admin listener speaks HTTPS only (a plain request is
// refused), with its token as before, offering HTTP/2; a reload reads its
// certificate again (a rotated one serves the next handshake), applies a
// new min_version, refuses a pair that does not load, and turns it off
// and on again for the connections accepted from then on.
func TestTheAdminListenerSpeaksTLS(t *testing.T) {
	files, pool := adminTLS(t)
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.AdminTLS, c.AdminToken = files, "s3cret" })
	code, serial, err := adminGet(t, f, pool, "/workers")
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnauthorized, code, "the token is asked for as before")
	assert.Equal(t, "7", serial)
	assert.Contains(t, adminPage(t, f, pool, "s3cret", "/metrics"),
		`fastroute_tls_certificate_expiry_timestamp_seconds{certificate="admin_tls"} `+expiryOf(t, files.CertFile)+"\n")
	resp, err := http.Get("http://" + f.r.AdminAddr() + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP to the TLS listener: %s", body)
	assert.Equal(t, "h2", adminProtocol(t, f, pool, tls.VersionTLS13), "HTTP/2 offered, as net/http does")

	f.r.SetConfigSource(func() (config.Config, error) { return f.r.CurrentConfig(), nil })
	rotated, rotatedPool := writeCert(t, t.TempDir(), 8)
	copyFile(t, rotated.CertFile, files.CertFile)
	copyFile(t, rotated.KeyFile, files.KeyFile)
	code, msg := f.reloadOverTLS(pool, "s3cret")
	require.Equal(t, http.StatusOK, code, msg)
	assert.Contains(t, msg, "admin_tls certificate read again")
	_, _, err = adminGet(t, f, pool, "/metrics")
	assert.Error(t, err, "the old certificate no longer serves")
	pool = rotatedPool
	_, serial, err = adminGet(t, f, pool, "/metrics")
	require.NoError(t, err)
	assert.Equal(t, "8", serial)

	// A new min_version applies to the next handshake.
	assert.Equal(t, "h2", adminProtocol(t, f, pool, tls.VersionTLS12))
	f.reloadsWith(func(c *config.Config) { c.AdminTLS.MinVersion = "1.3" })
	code, msg = f.reloadOverTLS(pool, "s3cret")
	require.Equal(t, http.StatusOK, code, msg)
	assert.Contains(t, msg, `admin_tls.min_version=\"1.3\"`)
	assert.Empty(t, adminProtocol(t, f, pool, tls.VersionTLS12), "a TLS 1.2 client is refused")
	assert.Equal(t, "h2", adminProtocol(t, f, pool, tls.VersionTLS13))

	require.NoError(t, os.WriteFile(files.KeyFile, []byte("not a key"), 0o600))
	code, msg = f.reloadOverTLS(pool, "s3cret")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, msg, "key admin_tls: ")
	assert.NotContains(t, msg, "not a key", "the file's content is not echoed")
	_, serial, err = adminGet(t, f, pool, "/metrics")
	require.NoError(t, err)
	assert.Equal(t, "8", serial, "the certificate read last stays")

	// Turned off, the next connections speak plain HTTP; on again, TLS.
	running := f.r.CurrentConfig().AdminTLS
	running.KeyFile = rotated.KeyFile // files' key was overwritten above
	f.reloadsWith(func(c *config.Config) { c.AdminTLS = config.AdminTLS{} })
	code, msg = f.reloadOverTLS(pool, "s3cret")
	require.Equal(t, http.StatusOK, code, msg)
	assert.Contains(t, msg, "admin_tls off: the admin listener's next connections speak plain HTTP")
	assert.Contains(t, msg, `"need_restart":[]`)
	code, _ = adminDo(t, f, "GET", "/workers", "", "s3cret")
	assert.Equal(t, http.StatusOK, code, "plain HTTP")
	_, _, err = adminGet(t, f, pool, "/workers")
	assert.ErrorContains(t, err, "server gave HTTP response to HTTPS client", "a TLS client is refused")
	_, page := adminDo(t, f, "GET", "/metrics", "", "s3cret")
	assert.NotContains(t, page, `certificate="admin_tls"`, "its certificate dropped")

	f.reloadsWith(func(c *config.Config) { c.AdminTLS = running })
	code, msg = adminDo(t, f, "POST", "/config/reload", "", "s3cret")
	require.Equal(t, http.StatusOK, code, msg)
	assert.Contains(t, msg, "admin_tls on: the admin listener's next connections speak TLS")
	code, _, err = adminGet(t, f, pool, "/workers")
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnauthorized, code, "TLS again, behind its token")
	resp, err = http.Get("http://" + f.r.AdminAddr() + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP refused again")
	assert.Equal(t, "h2", adminProtocol(t, f, pool, tls.VersionTLS13))

	cfg := config.Default()
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:1"}}
	cfg.AdminTLS.CertFile = files.CertFile
	assert.ErrorContains(t, cfg.Validate(), "key admin_tls: set cert_file and key_file together")
	cfg.AdminTLS = config.AdminTLS{PeerCAFile: "/no/such/ca.pem"}
	_, _, err = Check(cfg)
	assert.ErrorContains(t, err, "key admin_tls.peer_ca_file: open /no/such/ca.pem")
	cfg.AdminTLS = config.AdminTLS{ClientCAFile: files.CertFile}
	assert.ErrorContains(t, cfg.Validate(), "key admin_tls.client_ca_file: set, but admin_tls.cert_file is not")
	cfg.AdminTLS, _ = adminTLS(t) // files' key was overwritten above
	cfg.AdminTLS.ClientCAFile = "/no/such/ca.pem"
	_, _, err = Check(cfg)
	assert.ErrorContains(t, err, "key admin_tls.client_ca_file: open /no/such/ca.pem")
}

// With admin_tls.client_ca_file every client of the admin listener shows a
// certificate that CA signed (mutual TLS), its token asked for as before:
// one without a certificate, or with another CA's, gets no answer. A
// reload applies new CAs to the next handshake: a file replaced under its
// name (a CA rollover), or none (no certificate asked).
func TestTheAdminListenerAsksForClientCertificates(t *testing.T) {
	files, pool := adminTLS(t)
	clientCA := testpki.Root(t, "admin clients")
	caFile := testpki.WriteFile(t, "admin-clients.pem", testpki.CertPEM(clientCA.Cert))
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) {
		c.AdminTLS, c.AdminToken = files, "s3cret"
		c.AdminTLS.ClientCAFile = caFile
	})
	operator := clientCA.Client("operator", 2).Pair()
	code, _, _, err := adminTLSDoAs(t, f, pool, &operator, http.MethodGet, "/workers", "s3cret")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	code, _, _, err = adminTLSDoAs(t, f, pool, &operator, http.MethodGet, "/workers", "")
	require.NoError(t, err)
	assert.Equal(t, http.StatusUnauthorized, code, "the token is asked for as before")
	_, _, _, err = adminTLSDo(t, f, pool, http.MethodGet, "/workers", "s3cret")
	assert.Error(t, err, "no client certificate")
	stranger := testpki.Root(t, "other").Client("operator", 2).Pair()
	_, _, _, err = adminTLSDoAs(t, f, pool, &stranger, http.MethodGet, "/workers", "s3cret")
	assert.Error(t, err, "a certificate another CA signed")

	// A client that resumes its sessions: its second connection resumed.
	resuming := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{operator}, ClientSessionCache: tls.NewLRUClientSessionCache(4)}}}
	defer resuming.CloseIdleConnections()
	resumed := func() (bool, error) {
		resuming.CloseIdleConnections() // a new connection each time
		resp, err := resuming.Get("https://" + f.r.AdminAddr() + "/health")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return resp.TLS.DidResume, err
	}
	_, err = resumed()
	require.NoError(t, err)
	did, err := resumed()
	require.NoError(t, err)
	require.True(t, did, "the client's second connection resumed its session")

	// The bundle replaced in place by the next CA's (a CA rollover): the
	// next handshake asks for the new CA's certificates.
	nextCA := testpki.Root(t, "admin clients 2")
	require.NoError(t, os.WriteFile(caFile, testpki.CertPEM(nextCA.Cert), 0o600))
	f.reloadsWith(func(*config.Config) {})
	code, msg, _, err := adminTLSDoAs(t, f, pool, &operator, http.MethodPost, "/config/reload", "s3cret")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, msg)
	assert.Contains(t, msg, `admin_tls.client_ca_file=\"`+caFile+`\" read again`)
	assert.Contains(t, msg, `"need_restart":[]`)
	next := nextCA.Client("operator", 2).Pair()
	code, _, _, err = adminTLSDoAs(t, f, pool, &next, http.MethodGet, "/workers", "s3cret")
	require.NoError(t, err, "the new CA's clients are served")
	assert.Equal(t, http.StatusOK, code)
	_, _, _, err = adminTLSDoAs(t, f, pool, &operator, http.MethodGet, "/workers", "s3cret")
	assert.Error(t, err, "the old CA's are refused")
	_, err = resumed()
	assert.Error(t, err, "nor can one resume its way in")

	f.reloadsWith(func(c *config.Config) { c.AdminTLS.ClientCAFile = "" })
	code, msg, _, err = adminTLSDoAs(t, f, pool, &next, http.MethodPost, "/config/reload", "s3cret")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, msg)
	assert.Contains(t, msg, "admin_tls.client_ca_file dropped: no client certificate asked")
	code, _, _, err = adminTLSDo(t, f, pool, http.MethodGet, "/workers", "s3cret")
	require.NoError(t, err, "no certificate asked for")
	assert.Equal(t, http.StatusOK, code)
}

// A replica whose admin listener speaks plain HTTP may still post to
// https:// peers, checked against admin_tls.peer_ca_file: a reload reads
// that file again (it says so), and refuses one that no longer parses.
func TestAReloadReadsThePeerCAFileAgainWithoutAdminTLS(t *testing.T) {
	first, _ := writeCert(t, t.TempDir(), 7)
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.AdminTLS.PeerCAFile = first.CertFile })
	applied, needRestart, err := f.r.Reload(f.r.CurrentConfig())
	require.NoError(t, err)
	assert.Equal(t, []string{`admin_tls.peer_ca_file="` + first.CertFile + `" read again`}, applied)
	assert.Empty(t, needRestart)
	require.NoError(t, os.WriteFile(first.CertFile, []byte("not a certificate"), 0o600))
	_, _, err = f.r.Reload(f.r.CurrentConfig())
	require.ErrorContains(t, err, "key admin_tls.peer_ca_file")
	cfg := f.r.CurrentConfig()
	cfg.AdminTLS.PeerCAFile = ""
	applied, needRestart, err = f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"admin_tls.peer_ca_file dropped: peers' certificates checked against the system's roots"}, applied)
	assert.Empty(t, needRestart)
	assert.Empty(t, f.r.CurrentConfig().AdminTLS.PeerCAFile)
}

// adminProtocol is what a handshake with f's admin listener of a client
// trusting pool, speaking TLS up to version max, negotiated ("h2",
// "http/1.1"), or "" when it failed.
func adminProtocol(t *testing.T, f *fleet, pool *x509.CertPool, max uint16) string {
	t.Helper()
	c, err := tls.Dial("tcp", f.r.AdminAddr(), &tls.Config{RootCAs: pool, MaxVersion: max, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		return ""
	}
	defer c.Close()
	return c.ConnectionState().NegotiatedProtocol
}

// adminPage GETs path from f's admin listener over TLS with token
// (adminTLSDo) and returns the page.
func adminPage(t *testing.T, f *fleet, pool *x509.CertPool, token, path string) string {
	t.Helper()
	_, page, _, err := adminTLSDo(t, f, pool, http.MethodGet, path, token)
	require.NoError(t, err)
	return page
}

// reloadOverTLS posts /config/reload to f's admin listener over TLS
// (adminTLSDo).
func (f *fleet) reloadOverTLS(pool *x509.CertPool, token string) (int, string) {
	f.t.Helper()
	code, body, _, err := adminTLSDo(f.t, f, pool, http.MethodPost, "/config/reload", token)
	require.NoError(f.t, err)
	return code, body
}

// Replicas whose admin listeners speak TLS share their prefixes over
// https://, each checking the other's certificate against
// admin_tls.peer_ca_file; a replica that does not trust its peer's
// certificate sends it nothing (its posts fail, and are counted).
func TestReplicasSharePrefixesOverTLS(t *testing.T) {
	files, pool := adminTLS(t)
	overTLS := func(peerCA string) func(*config.Config) {
		return func(c *config.Config) {
			c.AdminTLS = files
			c.AdminTLS.PeerCAFile = peerCA
			for i, p := range c.Router.PrefixAffinity.Peers {
				c.Router.PrefixAffinity.Peers[i] = strings.Replace(p, "http://", "https://", 1)
			}
		}
	}
	a, b := sharingReplicas(t, true, overTLS(files.CertFile))
	converseVia([]*fleet{a, b}, 5, 4, nil)
	require.Eventually(t, func() bool {
		return b.r.PrefixesLearned() == a.r.Prefixes().Recorded() && a.r.PrefixesLearned() == b.r.Prefixes().Recorded()
	}, 15*time.Second, 2*time.Millisecond, "each replica took in the other's records over TLS")
	assert.NotZero(t, a.r.Prefixes().Recorded())
	a.assertIdle()
	b.assertIdle()

	// Each asks its clients for a certificate its CA signed: each shows
	// its admin certificate to the other.
	a, b = sharingReplicas(t, true, overTLS(files.CertFile), func(c *config.Config) { c.AdminTLS.ClientCAFile = files.CertFile })
	converseVia([]*fleet{a, b}, 5, 4, nil)
	require.Eventually(t, func() bool {
		return b.r.PrefixesLearned() == a.r.Prefixes().Recorded() && a.r.PrefixesLearned() == b.r.Prefixes().Recorded()
	}, 15*time.Second, 2*time.Millisecond, "each replica took in the other's records over mutual TLS")
	assert.NotZero(t, a.r.Prefixes().Recorded())

	other, _ := writeCert(t, t.TempDir(), 9) // a CA that did not sign the peers' certificate
	a, b = sharingReplicas(t, true, overTLS(other.CertFile))
	converseVia([]*fleet{a, b}, 5, 4, nil)
	require.NotZero(t, a.r.Prefixes().Recorded())
	failed := fmt.Sprintf(`fastroute_prefix_shared_records_total{peer="https://%s",outcome="failed"} `, b.r.AdminAddr())
	require.Eventually(t, func() bool {
		p := adminPage(t, a, pool, "", "/metrics")
		return strings.Contains(p, failed) && !strings.Contains(p, failed+"0\n")
	}, 15*time.Second, 10*time.Millisecond, "a's posts to a peer it does not trust fail")
	assert.Zero(t, b.r.PrefixesLearned(), "nothing reached b")

	// The peer CA file replaced in place by the CA that did sign the peer's
	// certificate: a reload applies it to the next post.
	trusted, err := os.ReadFile(files.CertFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(other.CertFile, trusted, 0o600))
	a.reloadsWith(func(*config.Config) {})
	code, msg := a.reloadOverTLS(pool, "")
	require.Equal(t, http.StatusOK, code, msg)
	assert.Contains(t, msg, `"need_restart":[]`)
	assert.Contains(t, msg, "admin_tls.peer_ca_file=")
	recorded := a.r.Prefixes().Recorded()
	converseVia([]*fleet{a}, 5, 4, nil)
	require.Greater(t, a.r.Prefixes().Recorded(), recorded)
	require.Eventually(t, func() bool { return b.r.PrefixesLearned() == a.r.Prefixes().Recorded()-recorded }, 15*time.Second, 2*time.Millisecond,
		"b takes in a's new records once a trusts it")
}

// A replica that advertises its admin listener's URL to the others keeps
// that listener's TLS on or off until a restart: the URL's scheme says
// which, and prefix_affinity.advertise waits for a restart too.
func TestAnAdvertisedAdminListenerTurnsTLSOnOnlyAtRestart(t *testing.T) {
	down := freeAdminAddrs(t, 2) // etcd is not needed to reload
	f := startFleet(t, cachingEngines(1), func(c *config.Config) {
		prefixAffinity(true)(c)
		c.AdminListen = down[1]
		c.Router.PrefixAffinity.Advertise = "http://" + down[1]
		c.Discovery.Etcd = config.Etcd{Endpoints: []string{down[0]}, Prefix: "/t-advertised", DialTimeout: 500 * time.Millisecond}
	})
	files, _ := adminTLS(t)
	cfg := f.r.CurrentConfig()
	cfg.AdminTLS = files
	cfg.Router.PrefixAffinity.Advertise = "https://" + down[1]
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"admin_tls", "router.prefix_affinity"}, needRestart)
	assert.NotContains(t, strings.Join(applied, " "), "admin_tls")
	assert.False(t, f.r.CurrentConfig().AdminTLS.On())
	code, _ := adminDo(t, f, "GET", "/workers", "", "")
	assert.Equal(t, http.StatusOK, code, "still plain HTTP")
}
