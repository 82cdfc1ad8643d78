package router

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startIPv6Mock starts a mock worker on the IPv6 loopback address, or
// skips the test where the machine has none.
func startIPv6Mock(t *testing.T, id uint64) *mockworker.Worker {
	t.Helper()
	m, err := mockworker.Start("[::1]:0", mockworker.Options{ID: id, Tokens: 3})
	if err != nil {
		t.Skipf("no IPv6 loopback address here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// A worker on an IPv6 address (static, or found in DNS as an AAAA
// record) is probed healthy and served, whole answers and streams: the
// prober and the proxy dial both address families, as the engine scraper
// (Go's net/http) always did.
func TestWorkersOnIPv6Addresses(t *testing.T) {
	static := startIPv6Mock(t, 1)
	require.True(t, strings.HasPrefix(static.URL(), "http://[::1]:"), static.URL())
	srv := startFakeDNS(t)
	found := startIPv6Mock(t, 2)
	_, port, err := net.SplitHostPort(found.Addr())
	require.NoError(t, err)
	srv.Set("v6only.fastroute.test", "::1") // an AAAA record and no A record
	f := startFleet(t, nil, func(c *config.Config) {
		c.Health.UnhealthyAfter = 2
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: static.URL()}}
		c.Discovery.DNS = config.DNS{Names: []string{"v6only.fastroute.test.:" + port}, Interval: 50 * time.Millisecond,
			Server: srv.Addr(), Scheme: "http"}
	})
	require.Len(t, f.r.Registry.All(), 2, "the static worker and the one DNS names")
	for _, w := range f.r.Registry.All() {
		assert.Contains(t, w.Spec().URL, "[::1]:")
	}
	// Both are served once probed, and stay: 2 failed probes (100 ms
	// apart) would take a worker out.
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 2 }, 5*time.Second, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, 2, f.r.Registry.Snapshot().Len(), "a worker on an IPv6 address failed its probes")

	served := map[string]int{}
	for range 6 {
		resp, body := f.send(http.MethodPost, "/v1/chat/completions", chatBody)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Contains(t, body, `"content":"tok0 tok1 tok2 "`)
		served[resp.Header.Get("x-fastroute-worker")]++
	}
	assert.Len(t, served, 2, "each IPv6 worker answered: %v", served)
	resp, body := f.send(http.MethodPost, "/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, 3, strings.Count(body, `"delta":{"content":"tok`), body)
	assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), body)
	f.assertIdle()
}

// SGLang's decode engine finds a prefill engine on an IPv6 address: the
// bootstrap host goes in brackets, which the mock worker needs as SGLang
// before its NetworkAddress did (it joins host and port as they are).
func TestSGLangPrefillOnIPv6(t *testing.T) {
	prefill, decode := startIPv6Mock(t, 1), startIPv6Mock(t, 2)
	_, port, err := net.SplitHostPort(prefill.Addr())
	require.NoError(t, err)
	f := startFleet(t, nil, func(c *config.Config) {
		c.Router.Disaggregation.Protocol = config.DisaggSGLang
		bootstrap, _ := strconv.Atoi(port) // a mock's bootstrap port is its HTTP port
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: prefill.URL(), Role: dataplane.RolePrefill, BootstrapPort: bootstrap},
			{ID: 2, URL: decode.URL(), Role: dataplane.RoleDecode}}
	})
	for range 2 {
		resp, body := f.send(http.MethodPost, "/v1/chat/completions", streamBody)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
		assert.Equal(t, 3, strings.Count(body, `"delta":{"content":"tok`), body)
		assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), body)
	}
	assert.EqualValues(t, 2, prefill.Served(), "each room prefilled on the prefill engine")
	assert.EqualValues(t, 2, f.r.Frontend.Metrics().Phase("prefill", "ok"))
	f.assertIdle()
}
