package frontend

import (
	"bufio"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// The client is the last hop that is not a trusted proxy, walking back
// from the connection's peer over every line of the header, nginx's
// real_ip_recursive on; a value that is no address stops the walk at the
// last trusted hop, and an untrusted peer is the client whatever it sends.
func TestRealIPWalksBackOverTrustedHops(t *testing.T) {
	r := &RealIP{Header: "X-Forwarded-For", From: []netip.Prefix{
		netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}}
	trustedPeer := netip.MustParseAddrPort("127.0.0.1:40000")
	for _, tc := range []struct {
		lines []string // the header's lines, in order
		peer  netip.AddrPort
		want  string
	}{
		{nil, trustedPeer, "127.0.0.1:40000"},
		{[]string{"203.0.113.7"}, trustedPeer, "203.0.113.7:0"},
		{[]string{"198.51.100.1, 203.0.113.7, 10.1.2.3"}, trustedPeer, "203.0.113.7:0"},
		{[]string{"198.51.100.1,203.0.113.9", "10.0.0.5"}, trustedPeer, "203.0.113.9:0"},
		{[]string{"10.0.0.1, 10.0.0.2"}, trustedPeer, "10.0.0.1:0"},
		{[]string{"bogus, 203.0.113.7"}, trustedPeer, "203.0.113.7:0"},
		{[]string{"203.0.113.7, bogus"}, trustedPeer, "127.0.0.1:40000"},
		{[]string{"203.0.113.7, bogus, 10.0.0.9"}, trustedPeer, "10.0.0.9:0"},
		{[]string{"203.0.113.7:51234"}, trustedPeer, "203.0.113.7:51234"},
		{[]string{"[2001:db8::5]:4444"}, trustedPeer, "[2001:db8::5]:4444"},
		{[]string{"[2001:db8::5], 2001:db8:ffff::1"}, trustedPeer, "[2001:db8::5]:0"},
		{[]string{"::ffff:203.0.113.7"}, trustedPeer, "203.0.113.7:0"},
		{[]string{"203.0.113.7,, "}, trustedPeer, "203.0.113.7:0"},
		{[]string{"203.0.113.7"}, netip.MustParseAddrPort("192.0.2.1:5000"), "192.0.2.1:5000"},
	} {
		var h fasthttp.RequestHeader
		raw := "GET / HTTP/1.1\r\nHost: r\r\n"
		for _, l := range tc.lines {
			raw += "X-Forwarded-For: " + l + "\r\n"
		}
		require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(raw+"\r\n"))))
		assert.Equal(t, tc.want, r.client(&h, tc.peer).String(), "%q from %s", tc.lines, tc.peer)
	}

	realIP := &RealIP{Header: "x-real-ip", From: r.From}
	var h fasthttp.RequestHeader
	require.NoError(t, h.Read(bufio.NewReader(strings.NewReader("GET / HTTP/1.1\r\nHost: r\r\nX-Real-IP: 203.0.113.50\r\n\r\n"))))
	assert.Equal(t, "203.0.113.50:0", realIP.client(&h, trustedPeer).String(), "a header of one address, its name in any case")
}

func TestAppendClientShowsAPortOnlyWhereOneCame(t *testing.T) {
	assert.Equal(t, "203.0.113.7", string(appendClient(nil, netip.MustParseAddrPort("203.0.113.7:0"))))
	assert.Equal(t, "203.0.113.7:51234", string(appendClient(nil, netip.MustParseAddrPort("203.0.113.7:51234"))))
	assert.Equal(t, "2001:db8::5", string(appendClient(nil, netip.MustParseAddrPort("[2001:db8::5]:0"))))
}

// FuzzRealIPClient checks the walk over any header lines fasthttp takes:
// it never panics, an untrusted peer is the client whatever the header
// says, and the client is the one a plain restatement of the rule finds
// over the header's values flattened (every line in order, split at its
// commas): from the peer back, each hop taken while the one after it is
// trusted, up to a value that is no address.
func FuzzRealIPClient(f *testing.F) {
	f.Add("203.0.113.7, 10.0.0.1", "", true)
	f.Add("198.51.100.1,203.0.113.9", "10.0.0.5", true)
	f.Add("[2001:db8::5]:4444, bogus", "", true)
	f.Add("10.0.0.1,, ,10.0.0.2", "::ffff:10.0.0.3", false)
	r := &RealIP{Header: "X-Forwarded-For", From: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}}
	f.Fuzz(func(t *testing.T, first, second string, trustedPeer bool) {
		raw := "GET / HTTP/1.1\r\nHost: r\r\nX-Forwarded-For: " + first + "\r\n"
		if second != "" {
			raw += "X-Forwarded-For: " + second + "\r\n"
		}
		var h fasthttp.RequestHeader
		if h.Read(bufio.NewReader(strings.NewReader(raw+"\r\n"))) != nil {
			return
		}
		peer := netip.MustParseAddrPort("192.0.2.1:5000")
		if trustedPeer {
			peer = netip.MustParseAddrPort("10.9.9.9:5000")
		}
		var values []string
		for _, line := range h.PeekAll("X-Forwarded-For") {
			for _, v := range strings.Split(string(line), ",") {
				if v = strings.TrimSpace(v); v != "" {
					values = append(values, v)
				}
			}
		}
		want := peer
		for i := len(values) - 1; i >= 0 && r.trusts(want.Addr()); i-- {
			hop, ok := parseHop([]byte(values[i]))
			if !ok {
				break
			}
			want = hop
		}
		got := r.client(&h, peer)
		if got != want {
			t.Fatalf("%q from %s: %s, the rule says %s", values, peer, got, want)
		}
		if !trustedPeer && got != peer {
			t.Fatalf("an untrusted peer's header was believed: %s", got)
		}
	})
}
