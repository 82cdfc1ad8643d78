package router

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/internal/testpki"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crlClient is a client with leaf's certificate that keeps its TLS
// sessions, so that a second connection resumes the first's session.
func crlClient(t *testing.T, pool *x509.CertPool, leaf *testpki.Leaf) *tls.Config {
	t.Helper()
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{leaf.Pair()},
		ClientSessionCache: tls.NewLRUClientSessionCache(4)}
}

// postOn sends one chat request on a new TLS connection under conf and
// returns its status and whether the connection resumed a session; an
// error when the handshake or the request failed.
func (f *fleet) postOn(conf *tls.Config) (status int, resumed bool, err error) {
	c, err := tls.Dial("tcp", f.r.Addr(), conf)
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
	if err != nil {
		return 0, false, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, false, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, c.ConnectionState().DidResume, nil
}

// With tls.client_crl_file a client whose certificate, or whose issuing
// CA's, its issuer's revocation list names fails its handshake and reaches
// no worker, as does one whose issuer's list is missing or out of date;
// the refusals are counted by reason. A reload reads the lists again, and
// a session resumed after it is checked too (tickets outlive a reload); a
// file that does not load refuses the reload and the lists read last stay.
func TestRevokedClientCertificatesAreRefused(t *testing.T) {
	server, pool := writeCert(t, t.TempDir(), 1)
	pki := testpki.NewTwoTier(t, "clients' root", "clients' issuing CA")
	root, issuing, alice, bob, carol := pki.Root, pki.Issuing, pki.Alice, pki.Bob, pki.Carol
	now := time.Now()
	lists := func(rootRevokes []int64, issuingRevokes ...int64) string {
		return testpki.WriteFile(t, "crl.pem", testpki.CRLPEM(root.CRL(now.Add(-time.Hour), now.Add(time.Hour), rootRevokes...)),
			testpki.CRLPEM(issuing.CRL(now.Add(-time.Hour), now.Add(time.Hour), issuingRevokes...)))
	}
	files := server
	files.ClientCAFile = testpki.WriteFile(t, "cas.pem", testpki.CertPEM(root.Cert))
	files.ClientCRLFile = lists(nil, 21) // bob revoked
	var logs syncBuffer
	f := startFleetLog(t, mocks(1, 1, 0), func(c *config.Config) { c.TLS = files }, &logs)
	served := func() int64 { return f.mocks[0].Served() }
	refusals := func(reason string) string {
		return metric(t, f, `fastroute_tls_client_crl_refusals_total{reason="`+reason+`"}`)
	}

	aliceConf := crlClient(t, pool, alice)
	code, resumed, err := f.postOn(aliceConf)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.False(t, resumed)
	code, resumed, err = f.postOn(aliceConf)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.True(t, resumed, "the second connection resumes the first's session")
	code, _, err = f.postOn(crlClient(t, pool, carol))
	require.NoError(t, err, "signed by the root, which revokes no one")
	assert.Equal(t, http.StatusOK, code)
	_, _, err = f.postOn(crlClient(t, pool, bob))
	assert.Error(t, err, "bob is revoked")
	assert.EqualValues(t, 3, served())
	assert.Equal(t, "1", refusals("revoked"))
	assert.Equal(t, "0", refusals("no_crl"))
	next := strconv.FormatFloat(float64(now.Add(time.Hour).Unix()), 'g', -1, 64)
	assert.Equal(t, next, metric(t, f, `fastroute_tls_client_crl_next_update_timestamp_seconds{issuer="CN=clients' root"}`))
	assert.Equal(t, next, metric(t, f, `fastroute_tls_client_crl_next_update_timestamp_seconds{issuer="CN=clients' issuing CA"}`))
	assert.Equal(t, expiryOf(t, server.CertFile), metric(t, f, `fastroute_tls_certificate_expiry_timestamp_seconds{certificate="tls"}`))

	// Reloaded with alice revoked: her resumed session is refused too.
	f.r.SetConfigSource(func() (config.Config, error) { return f.r.CurrentConfig(), nil })
	copyFile(t, lists(nil, 20), files.ClientCRLFile)
	code, body := adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `tls.client_crl_file=\"`+files.ClientCRLFile+`\" read again (lists of 2 issuers, revoked: 1)`)
	_, _, err = f.postOn(aliceConf)
	assert.Error(t, err, "alice's resumed session: refused")
	code, _, err = f.postOn(crlClient(t, pool, bob))
	require.NoError(t, err, "bob is no longer revoked")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "2", refusals("revoked"))

	// The issuing CA revoked by the root: alice and bob are out, carol in.
	copyFile(t, lists([]int64{100}), files.ClientCRLFile)
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	_, _, err = f.postOn(crlClient(t, pool, bob))
	assert.Error(t, err)
	code, _, err = f.postOn(crlClient(t, pool, carol))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)

	// No list of the issuing CA, then an out-of-date one (logged as read).
	copyFile(t, testpki.WriteFile(t, "root.pem", testpki.CRLPEM(root.CRL(now.Add(-time.Hour), now.Add(time.Hour)))), files.ClientCRLFile)
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	_, _, err = f.postOn(crlClient(t, pool, bob))
	assert.Error(t, err)
	assert.Equal(t, "1", refusals("no_crl"))
	_, _, err = f.postOn(crlClient(t, pool, alice))
	assert.Error(t, err)
	assert.Equal(t, "2", refusals("no_crl"))
	assert.Equal(t, 1, strings.Count(logs.String(), "reason=no_crl"), "a fault of the lists is logged once: %s", logs.String())
	assert.Equal(t, 0, strings.Count(logs.String(), "reason=revoked"), "a revoked client is not logged above debug")
	outdated := testpki.WriteFile(t, "old.pem", testpki.CRLPEM(root.CRL(now.Add(-time.Hour), now.Add(time.Hour))),
		testpki.CRLPEM(issuing.CRL(now.Add(-2*time.Hour), now.Add(-time.Hour))))
	copyFile(t, outdated, files.ClientCRLFile)
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, logs.String(), `issuer="CN=clients' issuing CA"`, "an out-of-date list is logged as it is read")
	_, _, err = f.postOn(crlClient(t, pool, bob))
	assert.Error(t, err)
	assert.Equal(t, "1", refusals("crl_outdated"))

	// A file that does not load: refused, the lists read last stay.
	require.NoError(t, os.WriteFile(files.ClientCRLFile, []byte("no CRL here"), 0o600))
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "key tls.client_crl_file: "+files.ClientCRLFile+` holds no CRL`)
	_, _, err = f.postOn(crlClient(t, pool, bob))
	assert.Error(t, err)
	assert.Equal(t, "2", refusals("crl_outdated"))
	assert.EqualValues(t, 5, served(), "alice twice, carol twice and bob once reached the worker")
	assert.Equal(t, 1, strings.Count(logs.String(), "reason=crl_outdated"), "an out-of-date list's refusals: one warning: %s", logs.String())
	f.assertIdle()

	// Dropped by a reload: no revocation checked, no refusal counted.
	f.reloadsWith(func(c *config.Config) { c.TLS.ClientCRLFile = "" })
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "tls.client_crl_file dropped")
	code, _, err = f.postOn(crlClient(t, pool, bob))
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.Empty(t, refusals("revoked"))

	// Started with an out-of-date list: one warning, as the files are read.
	var startLogs syncBuffer
	files.ClientCRLFile = outdated
	startFleetLog(t, mocks(1, 1, 0), func(c *config.Config) { c.TLS = files }, &startLogs)
	assert.Equal(t, 1, strings.Count(startLogs.String(), "a revocation list is out of date"), "%s", startLogs.String())

	cfg := config.Default()
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:1"}}
	cfg.TLS = server
	cfg.TLS.ClientCRLFile = testpki.WriteFile(t, "none.pem", []byte("no CRL here"))
	assert.ErrorContains(t, cfg.Validate(), "key tls.client_crl_file: set, but tls.client_ca_file is not")
	cfg.TLS.ClientCAFile = files.ClientCAFile
	_, _, err = Check(cfg)
	assert.ErrorContains(t, err, "key tls.client_crl_file: "+cfg.TLS.ClientCRLFile+" holds no CRL")
	assert.False(t, strings.Contains(fmt.Sprint(err), "no CRL here"), "the file's content is not echoed")
}
