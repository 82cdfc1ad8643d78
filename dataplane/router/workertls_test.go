package router

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/internal/tlsfiles"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// workerCerts are the files of a fleet whose workers speak TLS: the
// workers' certificate (its file is the CA the router trusts) and the
// router's client certificate.
type workerCerts struct {
	server, client config.TLS
}

func newWorkerCerts(t *testing.T) workerCerts {
	server, _ := writeCert(t, t.TempDir(), 10)
	client, _ := writeCert(t, t.TempDir(), 11)
	return workerCerts{server: server, client: client}
}

// workerTLSConf is a worker's TLS with cert as its certificate, requiring
// a client certificate clientCAFile's certificates signed when it is set.
func workerTLSConf(t *testing.T, cert config.TLS, clientCAFile string) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert.CertFile, cert.KeyFile)
	require.NoError(t, err)
	conf := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if clientCAFile != "" {
		pool, err := tlsfiles.Roots("client CA", clientCAFile)
		require.NoError(t, err)
		conf.ClientCAs, conf.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return conf
}

// routerTLS is the router's worker_tls: c's workers trusted, c's client
// certificate shown.
func (c workerCerts) routerTLS() config.WorkerTLS {
	return config.WorkerTLS{CAFile: c.server.CertFile, CertFile: c.client.CertFile, KeyFile: c.client.KeyFile}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o600))
}

// reachesBothWorkers waits until both workers passed a probe, listed
// their model and gave an engine reading, then sends six requests, whole
// and streamed in turn, one after the other's books closed: each worker
// answers three, on one kept connection.
func (f *fleet) reachesBothWorkers() {
	t := f.t
	t.Helper()
	require.Eventually(t, func() bool {
		for _, w := range f.r.Registry.All() {
			if !w.Healthy() || !slices.Contains(w.Models(), "mock-model") || w.Engine() == nil {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "probes, model listings and engine scrapes reach the workers")
	seen := map[string]int{}
	for i := range 6 {
		body := chatBody
		if i%2 == 1 {
			body = streamBody
		}
		resp, text := f.send(http.MethodPost, "/v1/chat/completions", body)
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
		w := resp.Header.Get("x-fastroute-worker")
		assert.Equal(t, w, resp.Header.Get("x-mock-worker"))
		if i%2 == 1 {
			assert.Equal(t, 3, strings.Count(text, "data: {"), text)
			assert.Contains(t, text, "data: [DONE]")
		} else {
			assert.Contains(t, text, `"chat.completion"`)
		}
		seen[w]++
		// The connection is back in its pool before the reservation is
		// released: the next request to the worker finds it there.
		f.assertIdle()
	}
	assert.Equal(t, map[string]int{"1": 3, "2": 3}, seen)
	for _, id := range []string{"1", "2"} {
		assert.Equal(t, "1", metric(t, f, `fastroute_worker_connects_total{worker="`+id+`"}`), "worker %s: one kept connection", id)
	}
}

func tlsMocks(n int, conf *tls.Config) []mockworker.Options {
	opts := mocks(n, 3, 5*time.Millisecond)
	for i := range opts {
		opts[i].TLS = conf
	}
	return opts
}

// workerFailures is the connect and transport failures of worker id.
func workerFailures(t *testing.T, f *fleet, id string) (connect, transport string) {
	return metric(t, f, `fastroute_worker_failures_total{worker="`+id+`",reason="connect"}`),
		metric(t, f, `fastroute_worker_failures_total{worker="`+id+`",reason="transport"}`)
}

// Workers whose url is https:// are spoken to over TLS, each showing a
// certificate the router checks against worker_tls.ca_file and asking for
// the router's (mutual TLS): requests whole and streamed on kept
// connections (one connect per worker for six requests), health probes,
// the /v1/models listings and the engine metrics scrapes all reach them.
func TestHTTPSWorkersAreSpokenToOverMutualTLS(t *testing.T) {
	c := newWorkerCerts(t)
	f := startFleet(t, tlsMocks(2, workerTLSConf(t, c.server, c.client.CertFile)), func(cfg *config.Config) { cfg.WorkerTLS = c.routerTLS() })
	for _, m := range f.mocks {
		require.True(t, strings.HasPrefix(m.URL(), "https://"), m.URL())
	}
	f.reachesBothWorkers()
	for _, id := range []string{"1", "2"} {
		connect, transport := workerFailures(t, f, id)
		assert.Equal(t, []string{"0", "0"}, []string{connect, transport}, "worker %s", id)
	}
	f.assertIdle()
	assert.Equal(t, expiryOf(t, c.client.CertFile), metric(t, f, `fastroute_tls_certificate_expiry_timestamp_seconds{certificate="worker_tls"}`),
		"the client certificate's notAfter")
	assert.Empty(t, metric(t, f, `fastroute_tls_certificate_expiry_timestamp_seconds{certificate="tls"}`), "no front end TLS, no line")
}

// expiryOf is the notAfter of the PEM certificate in file (its key beside
// it), as a metric's value reads.
func expiryOf(t *testing.T, file string) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(file, strings.TrimSuffix(file, "cert.pem")+"key.pem")
	require.NoError(t, err)
	return strconv.FormatFloat(float64(pair.Leaf.NotAfter.Unix()), 'g', -1, 64)
}

// A worker the router cannot speak TLS with is unreachable: one whose
// certificate worker_tls.ca_file did not sign fails the handshake (a
// connect failure), one that asks for a client certificate the router does
// not have refuses it (TLS 1.3 says so at the first read: a transport
// failure). Its requests move to the other worker, which serves them all,
// and its probes fail too.
func TestAWorkerTheRouterCannotSpeakTLSWithIsUnreachable(t *testing.T) {
	c := newWorkerCerts(t)
	stranger, _ := writeCert(t, t.TempDir(), 12)
	for _, tc := range []struct {
		name     string
		worker1  *tls.Config
		routerTC config.WorkerTLS
		reason   string // of worker 1's failures
	}{
		{"certificate not trusted", workerTLSConf(t, stranger, ""), c.routerTLS(), "connect"},
		{"no client certificate", workerTLSConf(t, c.server, c.client.CertFile), config.WorkerTLS{CAFile: c.server.CertFile}, "transport"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tlsMocks(2, workerTLSConf(t, c.server, ""))
			opts[0].TLS = tc.worker1
			f := startFleet(t, opts, func(cfg *config.Config) { cfg.WorkerTLS = tc.routerTC })
			for range 4 {
				resp, text := f.send(http.MethodPost, "/v1/chat/completions", chatBody)
				require.Equal(t, http.StatusOK, resp.StatusCode, text)
				assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
			}
			connect, transport := workerFailures(t, f, "1")
			failed := map[string]string{"connect": connect, "transport": transport}
			assert.NotEqual(t, "0", failed[tc.reason], "worker 1's failures: %v", failed)
			w1, _ := f.r.Registry.Get(1)
			require.Eventually(t, func() bool { return !w1.Healthy() }, 5*time.Second, 10*time.Millisecond, "its probes fail")
			f.assertIdle()
		})
	}
}

// A reload reads worker_tls's client certificate again: a worker that
// refused the router's certificate takes the one the files hold now; one
// whose certificate does not load is refused.
func TestAReloadReadsTheWorkersClientCertificateAgain(t *testing.T) {
	c := newWorkerCerts(t)
	dir := t.TempDir()
	old, _ := writeCert(t, dir, 20)
	f := startFleet(t, tlsMocks(1, workerTLSConf(t, c.server, c.client.CertFile)), func(cfg *config.Config) {
		cfg.WorkerTLS = config.WorkerTLS{CAFile: c.server.CertFile, CertFile: old.CertFile, KeyFile: old.KeyFile}
		cfg.Health.EjectAfter = 0
	})
	resp, text := f.send(http.MethodPost, "/v1/chat/completions", chatBody)
	require.GreaterOrEqual(t, resp.StatusCode, 500, "the worker refuses the first certificate: %s", text)

	copyFile(t, c.client.CertFile, old.CertFile)
	copyFile(t, c.client.KeyFile, old.KeyFile)
	cfg := f.r.CurrentConfig()
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"worker_tls client certificate read again"}, applied, "the CAs as they were: nothing else")
	assert.Empty(t, needRestart)
	require.Eventually(t, func() bool {
		resp, _ := f.send(http.MethodPost, "/v1/chat/completions", chatBody)
		return resp.StatusCode == http.StatusOK
	}, 5*time.Second, 50*time.Millisecond, "new connections show the certificate read again")

	bad := cfg
	bad.WorkerTLS.KeyFile = c.server.KeyFile // another certificate's key
	_, _, err = f.r.Reload(bad)
	require.ErrorContains(t, err, "key worker_tls")
	assert.Equal(t, old.KeyFile, f.r.CurrentConfig().WorkerTLS.KeyFile)
	resp, text = f.send(http.MethodPost, "/v1/chat/completions", chatBody)
	assert.Equal(t, http.StatusOK, resp.StatusCode, text)
	f.assertIdle()
}

// A reload applies how workers' certificates are checked to the next
// connection of the front end, the health probes and the engine scrapes:
// a CA file replaced under its name (a CA rollover) makes a worker whose
// certificate the new CA signed reachable, a server name its certificate
// does not carry makes it unreachable again, and a CA file that does not
// load is refused.
func TestAReloadAppliesTheWorkersCAs(t *testing.T) {
	c := newWorkerCerts(t)
	other, _ := writeCert(t, t.TempDir(), 21)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	copyFile(t, other.CertFile, caFile)
	f := startFleet(t, tlsMocks(1, workerTLSConf(t, c.server, "")), func(cfg *config.Config) {
		cfg.WorkerTLS = config.WorkerTLS{CAFile: caFile}
		cfg.Health.EjectAfter = 0
	})
	w1, _ := f.r.Registry.Get(1)
	resp, text := f.send(http.MethodPost, "/v1/chat/completions", chatBody, "x-worker-id", "1")
	require.GreaterOrEqual(t, resp.StatusCode, 500, "the worker's certificate is not trusted: %s", text)
	require.Eventually(t, func() bool { return !w1.Healthy() }, 5*time.Second, 10*time.Millisecond, "its probes fail")

	copyFile(t, c.server.CertFile, caFile)
	cfg := f.r.CurrentConfig()
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{`worker_tls.ca_file="` + caFile + `" read again`}, applied)
	assert.Empty(t, needRestart)
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(1) && w1.Engine() != nil }, 5*time.Second, 10*time.Millisecond,
		"the probes and the scrapes trust it")
	resp, text = f.send(http.MethodPost, "/v1/chat/completions", chatBody, "x-worker-id", "1")
	require.Equal(t, http.StatusOK, resp.StatusCode, "the front end's new connection trusts it: %s", text)

	named := cfg
	named.WorkerTLS.ServerName = "vllm.internal"
	applied, needRestart, err = f.r.Reload(named)
	require.NoError(t, err)
	assert.Equal(t, []string{`worker_tls.ca_file="` + caFile + `" read again`, `worker_tls.server_name="vllm.internal"`}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, "vllm.internal", f.r.CurrentConfig().WorkerTLS.ServerName)
	require.Eventually(t, func() bool { return !w1.Healthy() && w1.Engine() == nil }, 5*time.Second, 10*time.Millisecond,
		"the probes and the scrapes check the certificate for the new name on their next connections")

	require.NoError(t, os.WriteFile(caFile, []byte("not a certificate"), 0o600))
	_, _, err = f.r.Reload(cfg)
	require.ErrorContains(t, err, "key worker_tls.ca_file")
	assert.Equal(t, "vllm.internal", f.r.CurrentConfig().WorkerTLS.ServerName, "nothing applied")
	f.assertIdle()
}

// A kept-alive TLS connection its worker closes while it idles (uvicorn's
// keep-alive timeout) is closed at once by the watch on its socket, as a
// plain one is, and the next request goes on a new connection without a
// failure, resuming the first connection's session.
func TestTheWatchClosesATLSConnectionItsWorkerClosed(t *testing.T) {
	c := newWorkerCerts(t)
	conf := workerTLSConf(t, c.server, "")
	var lastResumed atomic.Bool // the last handshake resumed a session
	conf.VerifyConnection = func(cs tls.ConnectionState) error {
		lastResumed.Store(cs.DidResume)
		return nil
	}
	opts := tlsMocks(1, conf)
	opts[0].KeepAlive = 100 * time.Millisecond
	f := startFleet(t, opts, func(cfg *config.Config) {
		cfg.WorkerTLS = config.WorkerTLS{CAFile: c.server.CertFile}
		// No probe or scrape makes a connection of its own meanwhile.
		cfg.Health.Interval, cfg.Telemetry.Engine.Enabled = time.Hour, false
	})
	resp, text := f.send(http.MethodPost, "/v1/chat/completions", chatBody)
	require.Equal(t, http.StatusOK, resp.StatusCode, text)
	assert.False(t, lastResumed.Load(), "the first connection's handshake is a full one")
	require.Eventually(t, func() bool {
		return metric(t, f, `fastroute_worker_closed_connections_total{worker="1"}`) == "1" &&
			metric(t, f, `fastroute_worker_connections{worker="1"}`) == "0"
	}, 5*time.Second, 10*time.Millisecond, "the worker's close closed the pooled connection")
	resp, text = f.send(http.MethodPost, "/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, resp.StatusCode, text)
	assert.Equal(t, "2", metric(t, f, `fastroute_worker_connects_total{worker="1"}`))
	connect, transport := workerFailures(t, f, "1")
	assert.Equal(t, []string{"0", "0"}, []string{connect, transport})
	assert.True(t, lastResumed.Load(), "the second connection resumed the first one's session")
	f.assertIdle()
}

// A worker_tls file that does not load stops the start, naming its key.
func TestAWorkerTLSFileThatDoesNotLoadStopsTheStart(t *testing.T) {
	c := newWorkerCerts(t)
	for _, tc := range []struct {
		conf config.WorkerTLS
		want string
	}{
		{config.WorkerTLS{CAFile: c.server.KeyFile}, "key worker_tls.ca_file: " + c.server.KeyFile + " holds no PEM certificate"},
		{config.WorkerTLS{CAFile: c.server.CertFile + ".missing"}, "key worker_tls.ca_file: open "},
		{config.WorkerTLS{CertFile: c.client.CertFile, KeyFile: c.server.KeyFile}, "key worker_tls: tls: private key does not match public key"},
	} {
		cfg := config.Default()
		cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.WorkerTLS = tc.conf
		_, err := Start(cfg, nil)
		require.ErrorContains(t, err, tc.want)
		assert.NotContains(t, err.Error(), "PRIVATE KEY", "no file's content is quoted")
	}
}
