package frontend

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/pires/go-proxyproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// proxyHeaderSize finds a header's end as soon as it is whole, waits for
// more while what came may still begin one, and refuses bytes that cannot.
func TestProxyHeaderSize(t *testing.T) {
	v2 := "\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c" // PROXY over TCP4: 12 bytes of addresses follow
	longest := "PROXY TCP6 " + strings.Repeat("f", 94) + "\r\n"
	for _, tc := range []struct {
		b    string
		size int
		err  error
	}{
		{"PROXY TCP4 203.0.113.7 10.0.0.1 51234 8000\r\nPOST / HTTP/1.1\r\n", 44, nil},
		{"PROXY UNKNOWN\r\n", 15, nil},
		{"PRO", 0, errProxyHeaderPart},
		{"PROXY TCP4 203.0.113.7", 0, errProxyHeaderPart},
		{longest, 107, nil},
		{longest[:105] + "\r\r\n", 0, errProxyHeaderSize},
		{v2[:7], 0, errProxyHeaderPart},
		{v2, 28, nil},
		{v2 + "rest", 28, nil},
		{"POST / HTTP/1.1\r\n", 0, errNoProxyHeader},
		{"PROXZ", 0, errNoProxyHeader},
		{"\r\n\r\n\x01", 0, errNoProxyHeader},
	} {
		size, err := proxyHeaderSize([]byte(tc.b))
		assert.Equal(t, tc.size, size, "%q", tc.b)
		assert.Equal(t, tc.err, err, "%q", tc.b)
	}
}

// FuzzProxyHeader frames and parses fuzzed connection openings as the gate
// does: no panic; a size found is within the limits (a version 1 line of
// at most 107 bytes, a version 2 header of at least 16); and the address
// a whole header names is a TCP address that prints, whatever its family
// and command (go-proxyproto once returned a nil address for an undefined
// family byte, which printing it dereferenced).
func FuzzProxyHeader(f *testing.F) {
	for _, h := range []*proxyproto.Header{
		proxyproto.HeaderProxyFromAddrs(1, net.TCPAddrFromAddrPort(netip.MustParseAddrPort("203.0.113.7:51234")), net.TCPAddrFromAddrPort(netip.MustParseAddrPort("10.0.0.1:8000"))),
		proxyproto.HeaderProxyFromAddrs(2, net.TCPAddrFromAddrPort(netip.MustParseAddrPort("[2001:db8::5]:4444")), net.TCPAddrFromAddrPort(netip.MustParseAddrPort("[2001:db8::1]:8000"))),
		{Version: 2, Command: proxyproto.LOCAL, TransportProtocol: proxyproto.UNSPEC},
	} {
		b, err := h.Format()
		require.NoError(f, err)
		f.Add(append(b, "POST / HTTP/1.1\r\n"...))
	}
	f.Add([]byte("PROXY UNKNOWN\r\n"))
	f.Add([]byte("PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n"))
	f.Add([]byte("\r\n\r\n\x00\r\nQUIT\n\x21\x13\x00\x0c" + strings.Repeat("\x01", 12)))
	f.Add([]byte("POST / HTTP/1.1\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		size, err := proxyHeaderSize(b)
		if err != nil {
			return
		}
		if b[0] == 'P' {
			assert.LessOrEqual(t, size, proxyV1Max)
		} else {
			assert.GreaterOrEqual(t, size, 16)
		}
		if size > len(b) {
			return
		}
		addr, err := clientOf(b[:size])
		if err == nil && addr != nil {
			tcp, ok := addr.(*net.TCPAddr)
			require.True(t, ok, "%T", addr)
			assert.True(t, tcp.AddrPort().Addr().IsValid())
			assert.NotEmpty(t, addr.String())
		}
	})
}
