package router

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeCert writes a self-signed certificate for 127.0.0.1 with the given
// serial number, and its key, to dir's cert.pem and key.pem; it returns a
// pool that trusts it. It serves a server or a client.
func writeCert(t *testing.T, dir string, serial int64) (config.TLS, *x509.CertPool) {
	t.Helper()
	return writeCertWith(t, dir, serial, nil)
}

// writeCertWith is writeCert with edit applied to the certificate before it
// is signed.
func writeCertWith(t *testing.T, dir string, serial int64, edit func(*x509.Certificate)) (config.TLS, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "fastroute test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	if edit != nil {
		edit(tmpl)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	files := config.TLS{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	require.NoError(t, os.WriteFile(files.CertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(files.KeyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return files, pool
}

// tlsFleet is a fleet whose front end speaks TLS, with a client that
// trusts its certificate.
func tlsFleet(t *testing.T, opts []mockworker.Options) (*fleet, config.TLS, *tls.Config) {
	files, pool := writeCert(t, t.TempDir(), 1)
	f := startFleet(t, opts, func(c *config.Config) { c.TLS = files })
	client := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	f.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: client, MaxConnsPerHost: 1}}
	return f, files, client
}

func (f *fleet) postTLS(body string) (*http.Response, bool) {
	f.t.Helper()
	reused := false
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	req, err := http.NewRequest(http.MethodPost, "https://"+f.r.Addr()+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(f.t, err)
	resp, err := f.client.Do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	require.NoError(f.t, err)
	return resp, reused
}

// With tls set, clients speak TLS 1.2+ with HTTP/1.1 inside: answers whole
// and streamed, on kept connections.
func TestTheFrontEndSpeaksTLS(t *testing.T) {
	f, _, _ := tlsFleet(t, mocks(2, 3, 10*time.Millisecond))
	reusedAny := false
	for i := 0; i < 6; i++ {
		body := chatBody
		if i%2 == 1 {
			body = streamBody
		}
		resp, reused := f.postTLS(body)
		text := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
		require.NotNil(t, resp.TLS)
		assert.GreaterOrEqual(t, resp.TLS.Version, uint16(tls.VersionTLS12))
		if i%2 == 1 {
			assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
			assert.Equal(t, 3, strings.Count(text, "data: {"), text)
			assert.Contains(t, text, "data: [DONE]")
		} else {
			assert.Contains(t, text, `"chat.completion"`)
		}
		reusedAny = reusedAny || reused
	}
	assert.True(t, reusedAny, "requests after the first reuse the kept TLS connection")

	plain, err := net.Dial("tcp", f.r.Addr())
	require.NoError(t, err)
	fmt.Fprintf(plain, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
	require.NoError(t, plain.SetReadDeadline(time.Now().Add(5*time.Second)))
	got, _ := io.ReadAll(plain)
	plain.Close()
	assert.NotContains(t, string(got), "chat.completion", "plain HTTP on the TLS port is no request")
	resp, _ := f.postTLS(chatBody)
	assert.Equal(t, http.StatusOK, resp.StatusCode, readAll(t, resp))
	f.assertIdle()
}

// A TLS client that hangs up while its worker works cuts the worker's
// request at once, as a plain one does: its socket is watched.
func TestATLSClientThatLeavesCutsItsRequest(t *testing.T) {
	f, _, client := tlsFleet(t, []mockworker.Options{{ID: 1, Engine: mockworker.EngineOptions{MaxNumSeqs: 1, InterTokenLatency: 20 * time.Millisecond}}})
	queue := func(running int) func() bool {
		return func() bool { r, _ := f.mocks[0].Queue(); return r == running }
	}
	long := `{"model":"mock-model","max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}` // 40 s of answer
	c, err := tls.Dial("tcp", f.r.Addr(), client)
	require.NoError(t, err)
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(long), long)
	require.Eventually(t, queue(1), 5*time.Second, 5*time.Millisecond)
	require.NoError(t, c.Close())
	require.Eventually(t, queue(0), 2*time.Second, 5*time.Millisecond, "the engine stops the abandoned request")
	f.assertIdle()
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Requests("/v1/chat/completions", "cancelled"))
}

// A reload reads the certificate files again: new handshakes get the
// rotated certificate; a broken one refuses the reload and the running
// one stays. A missing file stops the start.
func TestReloadRotatesTheCertificate(t *testing.T) {
	f, files, client := tlsFleet(t, mocks(2, 1, 0))
	serial := func() int64 {
		c, err := tls.Dial("tcp", f.r.Addr(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test reads the certificate served
		require.NoError(t, err)
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	assert.EqualValues(t, 1, serial())
	kept, err := tls.Dial("tcp", f.r.Addr(), client)
	require.NoError(t, err)
	defer kept.Close()

	writeCert(t, filepath.Dir(files.CertFile), 2)
	f.r.SetConfigSource(func() (config.Config, error) { return f.r.CurrentConfig(), nil })
	code, body := adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "tls certificate read again")
	assert.EqualValues(t, 2, serial())
	fmt.Fprintf(kept, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
	resp, err := http.ReadResponse(bufio.NewReader(kept), nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a connection open before the rotation keeps working")
	readAll(t, resp)

	require.NoError(t, os.WriteFile(files.KeyFile, []byte("not a key"), 0o600))
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "key tls:")
	assert.EqualValues(t, 2, serial(), "the running certificate stays")
	f.assertIdle()

	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.TLS = config.TLS{CertFile: filepath.Join(t.TempDir(), "missing.pem"), KeyFile: files.KeyFile}
	_, err = Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	assert.ErrorContains(t, err, "key tls: open ")
}

// A reload turns the listener's TLS on (the connections accepted from
// then on speak TLS; one accepted before still speaks plain HTTP) and off
// again (plain HTTP for the next; the certificate's expiry line goes).
func TestAReloadTurnsTheListenersTLSOnAndOff(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), nil)
	plain := func() error {
		c := &http.Client{Timeout: 5 * time.Second}
		defer c.CloseIdleConnections()
		resp, err := c.Post("http://"+f.r.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err == nil {
			readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		return err
	}
	before, err := net.Dial("tcp", f.r.Addr())
	require.NoError(t, err)
	defer before.Close()
	require.NoError(t, before.SetDeadline(time.Now().Add(10*time.Second)))
	beforeServed := func() int {
		t.Helper()
		fmt.Fprintf(before, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
		resp, err := http.ReadResponse(bufio.NewReader(before), nil)
		require.NoError(t, err)
		readAll(t, resp)
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, beforeServed())

	files, pool := writeCert(t, t.TempDir(), 1)
	next := f.r.CurrentConfig()
	next.TLS = files
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"tls on: the connections accepted from now on speak TLS"}, applied)
	assert.Empty(t, needRestart)
	code, err := f.postAs(pool, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code, "over TLS")
	assert.Error(t, plain(), "plain HTTP on a new connection")
	assert.Equal(t, http.StatusOK, beforeServed(), "accepted before: plain HTTP still")
	assert.Equal(t, expiryOf(t, files.CertFile), metric(t, f, `fastroute_tls_certificate_expiry_timestamp_seconds{certificate="tls"}`))

	next.TLS = config.TLS{}
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"tls off: the connections accepted from now on speak plain HTTP"}, applied)
	assert.Empty(t, needRestart)
	assert.NoError(t, plain())
	_, err = f.postAs(pool, nil)
	assert.Error(t, err, "TLS on a new connection")
	assert.Empty(t, metric(t, f, `fastroute_tls_certificate_expiry_timestamp_seconds{certificate="tls"}`))
	assert.Equal(t, config.TLS{}, f.r.CurrentConfig().TLS)
	before.Close()
	f.assertIdle()
}

// reloadsWith has f's next reload read its running config with edit
// applied.
func (f *fleet) reloadsWith(edit func(*config.Config)) {
	f.r.SetConfigSource(func() (config.Config, error) {
		c := f.r.CurrentConfig()
		edit(&c)
		return c, nil
	})
}

// reloaded reloads f with its running config edited by edit, and returns
// what the reload applied, or its refusal; it asks that no key waited for
// a restart.
func (f *fleet) reloaded(edit func(*config.Config)) ([]string, error) {
	f.t.Helper()
	next := f.r.CurrentConfig()
	edit(&next)
	applied, needRestart, err := f.r.Reload(next)
	assert.Empty(f.t, needRestart)
	return applied, err
}

// postAs sends one chat request over TLS on a connection of its own,
// trusting pool, with the client certificate of as (nil: none), and
// returns its status; an error when the handshake or the request failed.
func (f *fleet) postAs(pool *x509.CertPool, as *config.TLS) (int, error) {
	f.t.Helper()
	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if as != nil {
		pair, err := tls.LoadX509KeyPair(as.CertFile, as.KeyFile)
		require.NoError(f.t, err)
		conf.Certificates = []tls.Certificate{pair}
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: conf}}
	defer client.CloseIdleConnections()
	resp, err := client.Post("https://"+f.r.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		return 0, err
	}
	readAll(f.t, resp)
	return resp.StatusCode, nil
}

// With tls.client_ca_file every client must show a certificate those CAs
// signed (mutual TLS): one without, or signed by another, fails its
// handshake and reaches no worker. A reload reads the CAs again (a client
// the new file trusts gets in, one it no longer trusts does not), or drops
// them; a file that does not load refuses the reload.
func TestClientsMustShowACertificateTheClientCAsSigned(t *testing.T) {
	server, pool := writeCert(t, t.TempDir(), 1)
	alice, _ := writeCert(t, t.TempDir(), 20)
	mallory, _ := writeCert(t, t.TempDir(), 21)
	spiffe := &url.URL{Scheme: "spiffe", Host: "example.org", Path: "/ns/batch/sa/summarizer"}
	service, _ := writeCertWith(t, t.TempDir(), 22, func(c *x509.Certificate) { c.Subject, c.URIs = pkix.Name{}, []*url.URL{spiffe} })
	caFile := filepath.Join(t.TempDir(), "clients.pem")
	var bundle []byte
	for _, c := range []config.TLS{alice, service} {
		pem, err := os.ReadFile(c.CertFile)
		require.NoError(t, err)
		bundle = append(bundle, pem...)
	}
	require.NoError(t, os.WriteFile(caFile, bundle, 0o600))
	files := server
	files.ClientCAFile = caFile
	var logs syncBuffer
	f := startFleetLog(t, mocks(2, 1, 0), func(c *config.Config) { c.TLS, c.Log.Access = files, "all" }, &logs)
	post := func(as *config.TLS) (int, error) { return f.postAs(pool, as) }
	served := func() int64 { return f.mocks[0].Served() + f.mocks[1].Served() }

	code, err := post(&alice)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "msg=access") }, 5*time.Second, 5*time.Millisecond)
	assert.Contains(t, logs.String(), `client_cert="fastroute test"`, "the access line names the client's certificate")
	// On a kept connection (a stream's take-over between), each request's
	// line names it.
	pair, err := tls.LoadX509KeyPair(alice.CertFile, alice.KeyFile)
	require.NoError(t, err)
	kept := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1,
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}}}
	for _, body := range []string{streamBody, chatBody} {
		resp, err := kept.Post("https://"+f.r.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	kept.CloseIdleConnections()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), `client_cert="fastroute test"`) == 3 }, 5*time.Second, 5*time.Millisecond)
	code, err = post(&service)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "client_cert=spiffe://example.org/ns/batch/sa/summarizer")
	}, 5*time.Second, 5*time.Millisecond,
		"a certificate without a common name is named by its URI: %s", logs.String())
	_, err = post(nil)
	assert.Error(t, err, "no client certificate: no request")
	_, err = post(&mallory)
	assert.Error(t, err, "a certificate the client CAs did not sign: no request")
	assert.EqualValues(t, 4, served(), "only alice's and the service's requests reached a worker")

	f.r.SetConfigSource(func() (config.Config, error) { return f.r.CurrentConfig(), nil })
	copyFile(t, mallory.CertFile, caFile)
	code, body := adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "tls.client_ca_file")
	_, err = post(&alice)
	assert.Error(t, err, "alice's CA is no longer trusted")
	code, err = post(&mallory)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)

	require.NoError(t, os.WriteFile(caFile, []byte("no certificate here"), 0o600))
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "key tls.client_ca_file: "+caFile+" holds no PEM certificate")
	code, err = post(&mallory)
	require.NoError(t, err, "the CAs read last stay")
	assert.Equal(t, http.StatusOK, code)

	f.reloadsWith(func(c *config.Config) { c.TLS.ClientCAFile = "" })
	code, body = adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "no client certificate asked")
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "msg=access") == 6 }, 5*time.Second, 5*time.Millisecond)
	mark := len(logs.String())
	code, err = post(nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	require.Eventually(t, func() bool { return strings.Contains(logs.String()[mark:], "msg=access") }, 5*time.Second, 5*time.Millisecond)
	assert.NotContains(t, logs.String()[mark:], "client_cert=", "no certificate, none named")
	assert.EqualValues(t, 7, served(), "alice three times and the service once, mallory twice, the one without a certificate once")
	f.assertIdle()

	cfg := config.Default()
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:1"}}
	cfg.TLS.ClientCAFile = caFile
	assert.ErrorContains(t, cfg.Validate(), "key tls.client_ca_file: set, but tls.cert_file is not")
}

// With tls.client_auth optional a client without a certificate gets in
// (its access line names none), one whose certificate the client CAs
// signed is named, and one another CA signed is still refused: a fleet's
// clients move to mutual TLS one by one. A reload sets it either way.
func TestOptionalClientCertificates(t *testing.T) {
	server, pool := writeCert(t, t.TempDir(), 1)
	alice, _ := writeCert(t, t.TempDir(), 20)
	mallory, _ := writeCert(t, t.TempDir(), 21)
	files := server
	files.ClientCAFile, files.ClientAuth = alice.CertFile, config.ClientAuthOptional
	var logs syncBuffer
	f := startFleetLog(t, mocks(1, 1, 0), func(c *config.Config) { c.TLS, c.Log.Access = files, "all" }, &logs)
	post := func(as *config.TLS) (int, error) { return f.postAs(pool, as) }
	accessLines := func() []string {
		var out []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "msg=access") {
				out = append(out, l)
			}
		}
		return out
	}

	code, err := post(nil)
	require.NoError(t, err, "no certificate: let in")
	assert.Equal(t, http.StatusOK, code)
	code, err = post(&alice)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	_, err = post(&mallory)
	assert.Error(t, err, "a certificate the client CAs did not sign is still refused")
	require.Eventually(t, func() bool { return len(accessLines()) == 2 }, 5*time.Second, 5*time.Millisecond)
	lines := accessLines()
	assert.NotContains(t, lines[0], "client_cert=")
	assert.Contains(t, lines[1], `client_cert="fastroute test"`)
	assert.EqualValues(t, 2, f.mocks[0].Served())

	f.reloadsWith(func(c *config.Config) { c.TLS.ClientAuth = config.ClientAuthRequire })
	code, body := adminDo(t, f, "POST", "/config/reload", "", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `tls.client_auth=\"require\"`)
	_, err = post(nil)
	assert.Error(t, err, "required from the next handshake on")
	code, err = post(&alice)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	f.assertIdle()

	cfg := config.Default()
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:1"}}
	cfg.TLS = server
	cfg.TLS.ClientAuth = config.ClientAuthOptional
	assert.ErrorContains(t, cfg.Validate(), "key tls.client_auth: set, but tls.client_ca_file is not")
	cfg.TLS.ClientCAFile, cfg.TLS.ClientAuth = alice.CertFile, "maybe"
	assert.ErrorContains(t, cfg.Validate(), `key tls.client_auth: "maybe" is not require or optional`)
}

// tls.min_version 1.3 refuses a client that speaks TLS 1.2 at most, and a
// reload sets it back; admin_tls.min_version does the same for the admin
// listener (a restart changes it there).
func TestTheOldestTLSVersionIsTheConfigs(t *testing.T) {
	files, pool := writeCert(t, t.TempDir(), 1)
	files.MinVersion = "1.3"
	admin, adminPool := adminTLS(t)
	admin.MinVersion = "1.3"
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.TLS, c.AdminTLS = files, admin })
	dial := func(addr string, pool *x509.CertPool, maxVersion uint16) error {
		c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, MaxVersion: maxVersion})
		if err == nil {
			c.Close()
		}
		return err
	}
	assert.Error(t, dial(f.r.Addr(), pool, tls.VersionTLS12), "a TLS 1.2 client: refused")
	assert.NoError(t, dial(f.r.Addr(), pool, tls.VersionTLS13))
	assert.Error(t, dial(f.r.AdminAddr(), adminPool, tls.VersionTLS12), "the admin listener's too")
	assert.NoError(t, dial(f.r.AdminAddr(), adminPool, tls.VersionTLS13))

	f.reloadsWith(func(c *config.Config) { c.TLS.MinVersion = "1.2" })
	code, body := f.reloadOverTLS(adminPool, "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `tls.min_version=\"1.2\"`)
	assert.NoError(t, dial(f.r.Addr(), pool, tls.VersionTLS12), "from the next handshake on")

	cfg := config.Default()
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:1"}}
	cfg.TLS.MinVersion = "1.1"
	assert.ErrorContains(t, cfg.Validate(), `key tls.min_version: "1.1" is not 1.2 or 1.3`)
	cfg.TLS.MinVersion, cfg.AdminTLS.MinVersion = "", "tls13"
	assert.ErrorContains(t, cfg.Validate(), `key admin_tls.min_version: "tls13" is not 1.2 or 1.3`)
}
