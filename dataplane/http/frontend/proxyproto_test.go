package frontend

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
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
