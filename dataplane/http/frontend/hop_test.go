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

// FuzzDropHops drops the hop-by-hop headers of fuzzed request and response
// heads: no panic, none of them left (nor a header the Connection header
// named), a Connection: close kept, and every other header kept as it was.
func FuzzDropHops(f *testing.F) {
	f.Add("Host: x\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nX-Keep: k\r\n")
	f.Add("Host: x\r\nConnection: keep-alive,,  upgrade ,\r\nUpgrade: h2c\r\nTE: trailers\r\nExpect: 100-continue\r\n")
	f.Add("Host: x\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n")
	f.Add("Host: x\r\nconnection: Content-Type, x-a, content-length, host\r\nX-A: 1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n")
	f.Fuzz(func(t *testing.T, fields string) {
		var req fasthttp.RequestHeader
		if req.Read(bufio.NewReader(strings.NewReader("POST /v1/chat/completions HTTP/1.1\r\n"+fields+"\r\n"))) == nil {
			checkDropHops(t, &req)
		}
		var resp fasthttp.ResponseHeader
		if resp.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n"+fields+"\r\n"))) == nil {
			checkDropHops(t, &resp)
		}
	})
}

func checkDropHops[H headerFields](t *testing.T, h H) {
	listed := string(h.Peek(fasthttp.HeaderConnection))
	closing := h.ConnectionClose()
	kept := map[string]bool{}
	for _, k := range h.PeekKeys() {
		if !isHop(k) && !connectionNames([]byte(listed), k) {
			kept[string(k)] = true
		}
	}
	dropHops(h)
	if h.ConnectionClose() != closing {
		t.Fatalf("Connection: close %v became %v", closing, h.ConnectionClose())
	}
	left := map[string]bool{}
	for _, k := range h.PeekKeys() {
		if string(k) == fasthttp.HeaderConnection && closing {
			continue // the kept flag, shown as a header
		}
		if isHop(k) || connectionNames([]byte(listed), k) {
			t.Fatalf("%s left (Connection: %q)", k, listed)
		}
		left[string(k)] = true
	}
	for k := range kept {
		if !left[k] {
			t.Fatalf("%s dropped (Connection: %q)", k, listed)
		}
	}
}
