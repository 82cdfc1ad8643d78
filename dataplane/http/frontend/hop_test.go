package frontend

import (
	"bufio"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// Dropping hop-by-hop headers allocates nothing, whether a head has none
// (its names are read once) or several, request or answer, and leaves none;
// nor does the check of a request's field names for a space.
func TestDroppingHopHeadersAllocatesNothing(t *testing.T) {
	for _, fields := range []string{
		"Host: x\r\nContent-Type: application/json\r\nX-Session-Id: s\r\nCookie: a=1\r\nContent-Length: 2\r\n",
		"Host: x\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\nContent-Length: 2\r\n",
		"host: x\r\nconnection: keep-alive, x-hop\r\nx-hop: 1\r\nkeep-alive: 5\r\nte: trailers\r\ncontent-length: 2\r\n",
	} {
		var req fasthttp.RequestHeader
		var resp fasthttp.ResponseHeader
		read := func() {
			req.Reset()
			resp.Reset()
			resp.DisableNormalizing() // as an answer is read (upCall.prepare)
			require.NoError(t, req.Read(bufio.NewReader(strings.NewReader("POST /v1/chat/completions HTTP/1.1\r\n"+fields+"\r\n"))))
			require.NoError(t, resp.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n"+fields+"\r\n"))))
		}
		read()
		assert.Zero(t, testing.AllocsPerRun(100, func() {
			read()
			if spacedFieldName(req.RawHeaders()) != nil {
				panic("a name without a space taken for one")
			}
			dropRequestHops(&req)
			dropAnswerHops(&resp)
		})-testing.AllocsPerRun(100, read), fields)
		read()
		checkRequestHops(t, &req)
		checkAnswerHops(t, &resp)
	}
}

// FuzzDropHops drops the hop-by-hop headers of fuzzed request and answer
// heads: no panic, none of them left (nor a header the Connection header
// named), a request's Connection: close kept, and every other header kept
// as it was.
func FuzzDropHops(f *testing.F) {
	f.Add("Host: x\r\nConnection: close, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: 5\r\nX-Keep: k\r\nCookie: a=1;b=2\r\n")
	f.Add("Host: x\r\nConnection: keep-alive,,  upgrade ,\r\nUpgrade: h2c\r\nTE: trailers\r\nExpect: 100-continue\r\n")
	f.Add("Host: x\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n")
	f.Add("Host: x\r\nconnection: Content-Type, x-a, content-length, host\r\nX-A: 1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n")
	f.Add("Host: x\r\nX-Fold: a\r\n b\r\nKeep-Alive : 5\r\nSet-Cookie: s=1\r\n")
	f.Add("Host: x\r\nconnection: x-a\r\nCONNECTION: X-B\r\nx-a: 1\r\nx-b: 2\r\nproxy-authenticate: Basic\r\n")
	f.Fuzz(func(t *testing.T, fields string) {
		var req fasthttp.RequestHeader
		if req.Read(bufio.NewReader(strings.NewReader("POST /v1/chat/completions HTTP/1.1\r\n"+fields+"\r\n"))) == nil {
			checkRequestHops(t, &req)
		}
		for _, asSent := range []bool{false, true} {
			var resp fasthttp.ResponseHeader
			if asSent {
				resp.DisableNormalizing() // as an answer is read (upCall.prepare)
			}
			if resp.Read(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n"+fields+"\r\n"))) == nil {
				checkAnswerHops(t, &resp)
			}
		}
	})
}

// checkRequestHops checks dropRequestHops on h (the Cookie header as sent
// is TestHopByHopHeadersStayOnTheirConnection's: listing the names here
// has fasthttp rewrite it).
func checkRequestHops(t *testing.T, h *fasthttp.RequestHeader) {
	closing := h.ConnectionClose()
	checkDropped(t, string(h.Peek(fasthttp.HeaderConnection)), h.PeekKeys, func() { dropRequestHops(h) }, closing)
	if h.ConnectionClose() != closing {
		t.Fatalf("Connection: close %v became %v", closing, h.ConnectionClose())
	}
}

// checkAnswerHops checks dropAnswerHops on h, whose names may be as sent:
// every Connection header is read, whatever its case.
func checkAnswerHops(t *testing.T, h *fasthttp.ResponseHeader) {
	var listed []string
	for k, v := range h.All() {
		if strings.EqualFold(string(k), fasthttp.HeaderConnection) {
			listed = append(listed, string(v))
		}
	}
	checkDropped(t, strings.Join(listed, ","), h.PeekKeys, func() { dropAnswerHops(h) }, false)
}

// checkDropped runs drop over headers whose names keys lists and whose
// Connection header is listed: no hop header or one listed is left, every
// other header is. A kept Connection: close shows as a header (closing).
func checkDropped(t *testing.T, listed string, keys func() [][]byte, drop func(), closing bool) {
	kept := map[string]bool{}
	for _, k := range keys() {
		if !isHop(k) && !connectionNames([]byte(listed), k) {
			kept[string(k)] = true
		}
	}
	drop()
	left := map[string]bool{}
	for _, k := range keys() {
		if string(k) == fasthttp.HeaderConnection && closing {
			continue
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

// A target in absolute form loses its scheme and host; any other is kept.
func TestOriginForm(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/chat/completions?a=b":               "/v1/chat/completions?a=b",
		"http://h.example/v1/completions":        "/v1/completions",
		"https://h.example:8443/v1/x?y=http://z": "/v1/x?y=http://z",
		"http://h.example":                       "/",
		"http://h.example?q=1":                   "/?q=1",
		"*":                                      "*",
	} {
		assert.Equal(t, want, string(originForm([]byte(in))), in)
	}
}
