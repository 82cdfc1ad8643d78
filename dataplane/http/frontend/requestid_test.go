package frontend

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// With GenerateRequestIDs, a request without an X-Request-Id reaches its
// worker with one made up (32 hex digits, another for each request), one
// with its own keeps it, and every answer carries the request's id once:
// a worker's answer, whose own echo of the id (vLLM's, in lower case) it
// replaces, a stream, and an answer the router made itself.
func TestRequestIDsAreMadeUpAndAnswered(t *testing.T) {
	got := make(chan *http.Request, 16)
	addr := rawServer(t, func(c net.Conn, req *http.Request) bool {
		got <- req
		echo := "x-request-id: " + req.Header.Get("X-Request-Id") + "\r\n"
		var err error
		if strings.Contains(req.URL.Path, "completions") && req.Header.Get("X-Stream") != "" {
			_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"+echo+"Transfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n0\r\n\r\n")
		} else {
			_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"+echo+"Content-Length: 2\r\n\r\n{}")
		}
		return err == nil
	})
	_, _, url := serveOne(t, addr, Options{Policy: Policy{GenerateRequestIDs: true}}, nil)
	c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions"))
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	br := bufio.NewReader(c)
	send := func(body string, lines ...string) (id string, status int) {
		t.Helper()
		extra := ""
		for _, l := range lines {
			extra += l + "\r\n"
		}
		_, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s", extra, len(body), body)
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Len(t, resp.Header.Values("X-Request-Id"), 1, "one id, whatever the case the worker wrote its own in: %v", resp.Header)
		return resp.Header.Get("X-Request-Id"), resp.StatusCode
	}
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	body := `{"model":"m","messages":[]}`

	first, status := send(body)
	assert.Equal(t, http.StatusOK, status)
	assert.Regexp(t, hex32, first)
	assert.Equal(t, first, (<-got).Header.Get("X-Request-Id"), "the worker got the id the client was answered")
	second, _ := send(body)
	assert.Regexp(t, hex32, second)
	assert.NotEqual(t, first, second, "a new id for each request")
	assert.Equal(t, second, (<-got).Header.Get("X-Request-Id"))

	own, _ := send(body, "X-Request-Id: client-7")
	assert.Equal(t, "client-7", own, "a client's id is kept")
	assert.Equal(t, "client-7", (<-got).Header.Get("X-Request-Id"))

	streamed, status := send(`{"model":"m","stream":true,"messages":[]}`, "X-Stream: 1")
	assert.Equal(t, http.StatusOK, status)
	assert.Regexp(t, hex32, streamed, "a stream's answer")
	assert.Equal(t, streamed, (<-got).Header.Get("X-Request-Id"))

	refused, status := send(`{"model":`)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Regexp(t, hex32, refused, "an answer the router made")
	assert.Empty(t, got, "the malformed request reached no worker")
}

// Making an id up and answering it allocate nothing once the headers'
// buffers have grown: the request path stays free of allocations with
// GenerateRequestIDs on.
func TestARequestIDAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Response.Header.DisableNormalizing() // as a worker's answer is copied in
	echo := []byte("x-request-id")
	stamp := func() {
		ctx.Request.Header.Del(headerRequestID)
		stampRequestID(&ctx)
		ctx.Response.Header.SetCanonical(echo, ctx.Request.Header.Peek(headerRequestID)) // the worker's echo
		answerRequestID(&ctx)
	}
	stamp()
	assert.Zero(t, testing.AllocsPerRun(100, stamp))
	n := 0
	for k := range ctx.Response.Header.All() {
		if strings.EqualFold(string(k), headerRequestID) {
			n++
		}
	}
	assert.Equal(t, 1, n, "the worker's echo replaced")
}
