package frontend

import (
	"bufio"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// Dropping hop-by-hop headers allocates nothing, whether a request has
// none (it is read once) or several, and is done once they are gone.
func TestDroppingHopHeadersAllocatesNothing(t *testing.T) {
	for _, raw := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Session-Id: s\r\nContent-Length: 2\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nContent-Length: 2\r\n\r\n",
	} {
		var h fasthttp.RequestHeader
		read := func() {
			h.Reset()
			require.NoError(t, h.Read(bufio.NewReader(strings.NewReader(raw))))
		}
		read()
		closing := h.ConnectionClose()
		assert.Zero(t, testing.AllocsPerRun(100, func() {
			read()
			dropHops(&h)
		})-testing.AllocsPerRun(100, read), raw)
		read()
		dropHops(&h)
		for k, v := range h.All() {
			if string(k) == fasthttp.HeaderConnection && string(v) == "close" {
				continue // the flag kept, which fasthttp shows as a header
			}
			assert.False(t, isHop(k) || string(k) == "X-Hop", "%s left in %q", k, raw)
		}
		assert.Equal(t, closing, h.ConnectionClose(), "Connection: close is kept")
	}
}
