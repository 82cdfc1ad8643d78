package router

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sendWithLines sends a chat request carrying the extra header lines
// (each "Name: value") on a connection of its own and returns the
// router's answer.
func (f *fleet) sendWithLines(lines ...string) string {
	f.t.Helper()
	return f.sendOnNewConnection(chatBody, lines...)
}

// sendOnNewConnection sends a chat request with body and header lines on
// a connection of its own, its last, and returns the raw answer.
func (f *fleet) sendOnNewConnection(body string, lines ...string) string {
	f.t.Helper()
	c, err := net.Dial("tcp", f.r.Addr())
	require.NoError(f.t, err)
	defer c.Close()
	require.NoError(f.t, c.SetDeadline(time.Now().Add(5*time.Second)))
	extra := ""
	for _, l := range lines {
		extra += l + "\r\n"
	}
	_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n%sConnection: close\r\nContent-Length: %d\r\n\r\n%s", extra, len(body), body)
	require.NoError(f.t, err)
	got, _ := io.ReadAll(c)
	return string(got)
}

// With real_ip, a request from a trusted HTTP balancer is logged and
// traced under the client its X-Forwarded-For names: the last hop that is
// not one of the balancers, over every line of the header; a value that
// is no address stops the walk. A router that does not trust the
// connection's peer logs the peer, whatever the header says.
func TestRealIPNamesTheClientBehindAnHTTPBalancer(t *testing.T) {
	var logs syncBuffer
	sink := startSink(t)
	f := startFleetLog(t, mocks(1, 3, 0), func(c *config.Config) {
		c.RealIP = config.RealIP{Header: "X-Forwarded-For", From: []string{"127.0.0.1", "10.0.0.0/8"}}
		c.Log.Access = "all"
		c.Tracing = tracing.Config{OTLPEndpoint: sink.URL(), SampleRatio: 1, ServiceName: "router-test"}
	}, &logs)
	for _, tc := range []struct {
		lines  []string
		client string
	}{
		{[]string{"X-Forwarded-For: 203.0.113.7"}, "203.0.113.7"},
		{[]string{"X-Forwarded-For: 198.51.100.1, 203.0.113.8, 10.1.2.3"}, "203.0.113.8"},
		{[]string{"X-Forwarded-For: 198.51.100.1, 203.0.113.9", "x-forwarded-for: 10.0.0.5"}, "203.0.113.9"},
		{[]string{"X-Forwarded-For: [2001:db8::5]:4444"}, "[2001:db8::5]:4444"},
		{[]string{"X-Forwarded-For: 203.0.113.7, not-an-address"}, "127.0.0.1:"},
		{nil, "127.0.0.1:"},
	} {
		ans := f.sendWithLines(tc.lines...)
		require.True(t, strings.HasPrefix(ans, "HTTP/1.1 200 "), "%q: %q", tc.lines, ans)
		clients := accessClients(&logs)
		require.NotEmpty(t, clients)
		got := clients[len(clients)-1]
		if strings.HasSuffix(tc.client, ":") {
			assert.True(t, strings.HasPrefix(got, tc.client), "%q: logged %s", tc.lines, got)
		} else {
			assert.Equal(t, tc.client, got, "%q", tc.lines)
		}
	}
	require.Eventually(t, func() bool { return len(sink.Spans()) == 6 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, "203.0.113.7", sink.Spans()[0].Attr("client.address"), "the span's client too")
	assert.Nil(t, sink.Spans()[0].Attr("client.port"), "a header that names no port: none")
	assert.Equal(t, int64(4444), sink.Spans()[3].Attr("client.port"))
	assert.Equal(t, "127.0.0.1", sink.Spans()[5].Attr("client.address"))

	f.assertIdle()

	g := startFleetLog(t, mocks(1, 3, 0), func(c *config.Config) {
		c.RealIP = config.RealIP{Header: "X-Real-IP", From: []string{"10.0.0.0/8"}}
		c.Log.Access = "all"
	}, &logs)
	ans := g.sendWithLines("X-Real-IP: 203.0.113.7")
	require.True(t, strings.HasPrefix(ans, "HTTP/1.1 200 "), "%q", ans)
	clients := accessClients(&logs)
	assert.True(t, strings.HasPrefix(clients[len(clients)-1], "127.0.0.1:"), "from a peer it does not trust: logged %s", clients[len(clients)-1])
	g.assertIdle()
}

// real_ip takes a header name and the balancers' IPs or CIDR prefixes, the
// one with the other; a reload applies a change to the next request (a
// balancer replaced), and refuses a bad one.
func TestRealIPConfig(t *testing.T) {
	for _, tc := range []struct {
		ri  config.RealIP
		err string
	}{
		{config.RealIP{}, ""},
		{config.RealIP{Header: "X-Forwarded-For", From: []string{"10.0.0.0/8", "2001:db8::/32", "192.0.2.1"}}, ""},
		{config.RealIP{Header: "X-Forwarded-For"}, "key real_ip.from: names no proxy: every client could then name its own address in X-Forwarded-For"},
		{config.RealIP{From: []string{"10.0.0.0/8"}}, "key real_ip.from: set, but real_ip.header is empty"},
		{config.RealIP{Header: "X-Forwarded-For", From: []string{"lb.example"}}, `key real_ip.from: "lb.example" is neither an IP nor a CIDR prefix`},
		{config.RealIP{Header: "X Forwarded", From: []string{"10.0.0.0/8"}}, `key real_ip.header: "X Forwarded" is not a header name`},
	} {
		cfg := config.Default()
		cfg.RealIP = tc.ri
		err := cfg.Validate()
		if tc.err == "" {
			assert.NoError(t, err, "%+v", tc.ri)
		} else if assert.Error(t, err, "%+v", tc.ri) {
			assert.Contains(t, err.Error(), tc.err)
		}
	}
	var logs syncBuffer
	f := startFleetLog(t, mocks(1, 1, 0), func(c *config.Config) { c.Log.Access = "all" }, &logs)
	lastClient := func() string {
		ans := f.sendWithLines("X-Forwarded-For: 203.0.113.7")
		require.True(t, strings.HasPrefix(ans, "HTTP/1.1 200 "), "%q", ans)
		clients := accessClients(&logs)
		require.NotEmpty(t, clients)
		return clients[len(clients)-1]
	}
	assert.True(t, strings.HasPrefix(lastClient(), "127.0.0.1:"), "no balancer trusted")
	cfg := f.r.CurrentConfig()
	cfg.RealIP = config.RealIP{Header: "X-Forwarded-For"}
	_, _, err := f.r.Reload(cfg)
	require.ErrorContains(t, err, "key real_ip.from: names no proxy")
	assert.True(t, strings.HasPrefix(lastClient(), "127.0.0.1:"), "a refused reload changes nothing")
	cfg.RealIP.From = []string{"127.0.0.1"}
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{`real_ip={header: "X-Forwarded-For", from: [127.0.0.1]}`}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, "203.0.113.7", lastClient(), "the header of the balancer the reload trusts")
	f.assertIdle()
}
