package router

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/pires/go-proxyproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proxyHeader is the PROXY protocol header of the given version that a
// balancer sends for a client at src (host:port) reaching it at
// 10.0.0.1:8000.
func proxyHeader(t *testing.T, version byte, src string) []byte {
	t.Helper()
	from, err := net.ResolveTCPAddr("tcp", src)
	require.NoError(t, err)
	to := &net.TCPAddr{IP: net.ParseIP("10.0.0.1"), Port: 8000}
	if from.IP.To4() == nil {
		to.IP = net.ParseIP("2001:db8::1")
	}
	b, err := proxyproto.HeaderProxyFromAddrs(version, from, to).Format()
	require.NoError(t, err)
	return b
}

// throughBalancer sends head, in two writes 50 ms apart when split, then a
// chat request on the same connection (over TLS with tlsConf), and returns
// what the router answered before it closed the connection.
func (f *fleet) throughBalancer(head []byte, split bool, tlsConf *tls.Config) string {
	f.t.Helper()
	c, err := net.Dial("tcp", f.r.Addr())
	require.NoError(f.t, err)
	defer c.Close()
	require.NoError(f.t, c.SetDeadline(time.Now().Add(5*time.Second)))
	if split {
		_, err = c.Write(head[:len(head)/2])
		require.NoError(f.t, err)
		time.Sleep(50 * time.Millisecond)
		head = head[len(head)/2:]
	}
	_, err = c.Write(head)
	require.NoError(f.t, err)
	conn := c
	if tlsConf != nil {
		conn = tls.Client(c, tlsConf)
	}
	_, _ = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
	got, _ := io.ReadAll(conn) // a refused connection is reset: what came, none
	return string(got)
}

// accessClients returns the client addresses of the access log's lines.
func accessClients(logs *syncBuffer) []string {
	var out []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if _, rest, ok := strings.Cut(l, " client="); ok && strings.Contains(l, "log=access") {
			client, _, _ := strings.Cut(rest, " ")
			out = append(out, client)
		}
	}
	return out
}

// With proxy_protocol on, a connection begins with a balancer's PROXY
// protocol header, version 1 or 2, whole or in pieces: its request is
// served and the access log shows the client the header names, or the
// connection's own address for the balancer's own connection (a version 2
// LOCAL, a version 1 UNKNOWN). A connection without a header, with a
// malformed one, with one too long or none within read_timeout is closed
// unserved, counted and logged; no worker sees it, and nothing stays open
// or reserved.
func TestProxyProtocolNamesTheClientBehindABalancer(t *testing.T) {
	var logs syncBuffer
	sink := startSink(t)
	f := startFleetLog(t, mocks(1, 3, 0), func(c *config.Config) {
		c.ProxyProtocol.Enabled = true
		c.Log.Access = "all"
		c.Limits.ReadTimeout = time.Second // the split headers pause 50 ms: far below, even on a loaded machine
		c.Tracing = tracing.Config{OTLPEndpoint: sink.URL(), SampleRatio: 1, ServiceName: "router-test"}
	}, &logs)
	local, err := (&proxyproto.Header{Version: 2, Command: proxyproto.LOCAL, TransportProtocol: proxyproto.UNSPEC}).Format()
	require.NoError(t, err)
	for _, tc := range []struct {
		head   []byte
		split  bool
		client string
	}{
		{proxyHeader(t, 1, "203.0.113.7:51234"), false, "203.0.113.7:51234"},
		{proxyHeader(t, 1, "203.0.113.8:51235"), true, "203.0.113.8:51235"},
		{proxyHeader(t, 2, "[2001:db8::5]:4444"), true, "[2001:db8::5]:4444"},
		{local, false, "127.0.0.1:"},
		{[]byte("PROXY UNKNOWN\r\n"), false, "127.0.0.1:"},
	} {
		ans := f.throughBalancer(tc.head, tc.split, nil)
		assert.True(t, strings.HasPrefix(ans, "HTTP/1.1 200 "), "%q: %q", tc.head, ans)
		clients := accessClients(&logs)
		if assert.NotEmpty(t, clients) {
			assert.True(t, strings.HasPrefix(clients[len(clients)-1], tc.client), "%q: logged %s", tc.head, clients[len(clients)-1])
		}
	}
	served := f.mocks[0].Served()
	assert.EqualValues(t, 5, served)
	require.Eventually(t, func() bool { return len(sink.Spans()) == 5 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, "203.0.113.7", sink.Spans()[0].Attr("client.address"), "the span's client too")
	assert.Equal(t, int64(51234), sink.Spans()[0].Attr("client.port"))

	for _, head := range [][]byte{
		nil, // the request alone
		[]byte("PROXY TCP4 bogus\r\n"),
		[]byte("PROXY TCP4 " + strings.Repeat("1", 120) + "\r\n"),
	} {
		assert.Empty(t, f.throughBalancer(head, false, nil), "%q", head)
	}
	// A header that never ends is closed after read_timeout.
	c, err := net.Dial("tcp", f.r.Addr())
	require.NoError(t, err)
	defer c.Close()
	began := time.Now()
	_, err = io.WriteString(c, "PROXY TCP4 203.0.113.7 10.0.0.1 51234")
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	got, err := io.ReadAll(c)
	if err != nil { // what it sent is unread: the close is a reset
		assert.ErrorIs(t, err, syscall.ECONNRESET, "closed by the router")
	}
	assert.Empty(t, got)
	assert.GreaterOrEqual(t, time.Since(began), 900*time.Millisecond, "after read_timeout")
	assert.Equal(t, served, f.mocks[0].Served(), "no worker saw a refused connection")
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	assert.Contains(t, metrics, "fastroute_proxy_protocol_refusals_total 4\n")
	assert.Equal(t, 1, strings.Count(logs.String(), "must begin with a PROXY protocol header"), "logged once a minute")
	require.Eventually(t, func() bool { return f.r.Frontend.OpenConnections() == 0 }, 5*time.Second, 10*time.Millisecond)
	f.assertIdle()
}

// With proxy_protocol.from, only connections from those addresses carry a
// header: another is served under its own address, and a header it sends
// is no header but a malformed request, so a client past the balancer
// cannot name an address of its choosing. Over TLS the header comes before
// the handshake.
func TestProxyProtocolTrustsOnlyItsBalancers(t *testing.T) {
	var logs syncBuffer
	f := startFleetLog(t, mocks(1, 3, 0), func(c *config.Config) {
		c.ProxyProtocol = config.ProxyProtocol{Enabled: true, From: []string{"10.0.0.0/8", "192.0.2.1"}}
		c.Log.Access = "all"
	}, &logs)
	ans := f.throughBalancer(nil, false, nil)
	assert.True(t, strings.HasPrefix(ans, "HTTP/1.1 200 "), "%q", ans)
	ans = f.throughBalancer(proxyHeader(t, 1, "203.0.113.7:51234"), false, nil)
	assert.True(t, strings.HasPrefix(ans, "HTTP/1.1 400 "), "%q", ans)
	assert.Contains(t, ans, "malformed HTTP request")
	clients := accessClients(&logs)
	require.NotEmpty(t, clients)
	for _, c := range clients {
		assert.True(t, strings.HasPrefix(c, "127.0.0.1:"), "logged %s", c)
	}

	files, pool := writeCert(t, t.TempDir(), 1)
	g := startFleetLog(t, mocks(1, 3, 0), func(c *config.Config) {
		c.ProxyProtocol = config.ProxyProtocol{Enabled: true, From: []string{"127.0.0.0/8"}}
		c.Log.Access = "all"
		c.TLS = files
	}, &logs)
	ans = g.throughBalancer(proxyHeader(t, 2, "198.51.100.9:7000"), false, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	assert.True(t, strings.HasPrefix(ans, "HTTP/1.1 200 "), "%q", ans)
	clients = accessClients(&logs)
	assert.Equal(t, "198.51.100.9:7000", clients[len(clients)-1])
	g.assertIdle()
}

// proxy_protocol.from takes IPs and CIDR prefixes, and only with
// proxy_protocol on.
func TestProxyProtocolConfig(t *testing.T) {
	for _, tc := range []struct {
		pp  config.ProxyProtocol
		err string
	}{
		{config.ProxyProtocol{Enabled: true, From: []string{"10.0.0.0/8", "2001:db8::/32", "192.0.2.1", "::1"}}, ""},
		{config.ProxyProtocol{Enabled: true, From: []string{"10.0.0.0/33"}}, `key proxy_protocol.from: "10.0.0.0/33" is neither an IP nor a CIDR prefix`},
		{config.ProxyProtocol{Enabled: true, From: []string{"lb.example"}}, `"lb.example" is neither`},
		{config.ProxyProtocol{From: []string{"10.0.0.0/8"}}, "key proxy_protocol.from: set, but proxy_protocol.enabled is false"},
	} {
		cfg := config.Default()
		cfg.ProxyProtocol = tc.pp
		err := cfg.Validate()
		if tc.err == "" {
			assert.NoError(t, err)
		} else if assert.Error(t, err) {
			assert.Contains(t, err.Error(), tc.err)
		}
	}
}

// A reload turns proxy_protocol on, off, or changes its from, for the
// connections accepted from then on: one open before keeps serving as it
// was accepted.
func TestAReloadAppliesProxyProtocol(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), nil)
	before, err := net.Dial("tcp", f.r.Addr())
	require.NoError(t, err)
	defer before.Close()
	require.NoError(t, before.SetDeadline(time.Now().Add(5*time.Second)))
	served := func(c net.Conn) string {
		t.Helper()
		_, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		readAll(t, resp)
		return resp.Status
	}
	assert.Equal(t, "200 OK", served(before))
	header := proxyHeader(t, 2, "198.51.100.9:7000")

	cfg := f.r.CurrentConfig()
	cfg.ProxyProtocol.Enabled = true
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"proxy_protocol={enabled: true, from: []}"}, applied)
	assert.Empty(t, needRestart)
	assert.Empty(t, f.throughBalancer(nil, false, nil), "a new connection without a header: closed unserved")
	assert.True(t, strings.HasPrefix(f.throughBalancer(header, false, nil), "HTTP/1.1 200 "))
	assert.Equal(t, "200 OK", served(before), "a connection accepted before the reload keeps its way")

	cfg.ProxyProtocol.From = []string{"192.0.2.0/24"}
	applied, _, err = f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"proxy_protocol={enabled: true, from: [192.0.2.0/24]}"}, applied)
	assert.True(t, strings.HasPrefix(f.throughBalancer(nil, false, nil), "HTTP/1.1 200 "), "loopback is no balancer now")

	cfg.ProxyProtocol = config.ProxyProtocol{}
	applied, _, err = f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"proxy_protocol={enabled: false, from: []}"}, applied)
	assert.True(t, strings.HasPrefix(f.throughBalancer(header, false, nil), "HTTP/1.1 400 "), "off: a header is a malformed request")
	assert.Equal(t, config.ProxyProtocol{}, f.r.CurrentConfig().ProxyProtocol)
	before.Close()
	f.assertIdle()
}
