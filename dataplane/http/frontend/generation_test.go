package frontend

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chatOf is a raw HTTP/1.1 chat request whose body is about size bytes,
// with extra header lines.
func chatOf(size int, extra string) string {
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", max(0, size-60)) + `"}]}`
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		extra, len(body), body)
}

// exchangeOn sends request on c and reads its answer: its status and body.
func exchangeOn(t *testing.T, c net.Conn, br *bufio.Reader, request string) (int, string) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err := io.WriteString(c, request)
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// closedAfter waits up to 5 s for the front end to close c (read through
// br) and says how long that took.
func closedAfter(t *testing.T, c net.Conn, br *bufio.Reader) time.Duration {
	t.Helper()
	start := time.Now()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err := br.ReadByte()
	require.ErrorIs(t, err, io.EOF)
	return time.Since(start)
}

// New client limits bound the connections handed to fasthttp from then on:
// new ones, a kept-alive one a stream gave back, and one that fasthttp
// served under the old limits once its next request was answered (the
// request that the old server read is the last it serves there; one sent
// with the next one behind it, pipelined, closes the connection after its
// answer). The gate's wait for a new connection's request follows the new
// read timeout. Once the connections of the old limits moved or closed,
// their fasthttp server is let go of; Shutdown closes the connections of
// every generation, and occupancy returns to 0.
func TestNewClientLimitsBoundTheConnectionsHandedOverNext(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n0\r\n\r\n"
	var slowAnswering atomic.Bool
	addr := rawServer(t, func(c net.Conn, req *http.Request) bool {
		answer := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
		if req.Header.Get("X-Sse") != "" {
			answer = sse
		}
		if req.Header.Get("X-Slow") != "" {
			time.Sleep(600 * time.Millisecond)
			slowAnswering.Store(true) // before the answer leaves: the router cannot have it sooner
		}
		_, err := io.WriteString(c, answer)
		return err == nil
	})
	reg, s, url := serveOne(t, addr, Options{ClientLimits: ClientLimits{MaxBodyBytes: 1 << 10}}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}

	kept, keptR := dial()         // served by fasthttp, moves after its next request
	keptBig, keptBigR := dial()   // served by fasthttp, its next request too large for the old bound
	piped, pipedR := dial()       // served by fasthttp, its next two requests sent together
	streamed, streamedR := dial() // its stream gives it back to the gate
	for _, c := range []struct {
		net.Conn
		*bufio.Reader
	}{{kept, keptR}, {keptBig, keptBigR}, {piped, pipedR}, {streamed, streamedR}} {
		status, _ := exchangeOn(t, c.Conn, c.Reader, chatOf(200, ""))
		require.Equal(t, http.StatusOK, status)
	}
	status, body := exchangeOn(t, streamed, streamedR, chatOf(200, "X-Sse: 1\r\n"))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "data: a\n\n", body)

	s.SetClientLimits(ClientLimits{MaxBodyBytes: 64 << 10, ReadTimeout: 200 * time.Millisecond, IdleTimeout: time.Minute})
	fresh, freshR := dial()
	status, _ = exchangeOn(t, fresh, freshR, chatOf(8<<10, ""))
	assert.Equal(t, http.StatusOK, status, "a new connection: the new bound")
	status, _ = exchangeOn(t, streamed, streamedR, chatOf(8<<10, ""))
	assert.Equal(t, http.StatusOK, status, "given back by its stream: the new bound")
	status, body = exchangeOn(t, keptBig, keptBigR, chatOf(8<<10, ""))
	assert.Equal(t, http.StatusRequestEntityTooLarge, status, "read by the old server: the old bound")
	assert.Contains(t, body, "(1024 bytes)", "the bound that applied")
	keptBig.Close() // as the answer's Connection: close asks
	status, _ = exchangeOn(t, kept, keptR, chatOf(200, ""))
	assert.Equal(t, http.StatusOK, status, "read by the old server")
	status, _ = exchangeOn(t, kept, keptR, chatOf(8<<10, ""))
	assert.Equal(t, http.StatusOK, status, "moved on after its answer: the new bound")
	// Two requests sent together: the first is answered, as the
	// connection's last, and the second is not lost unsaid.
	require.NoError(t, piped.SetDeadline(time.Now().Add(5*time.Second)))
	_, err := io.WriteString(piped, chatOf(200, "")+chatOf(200, ""))
	require.NoError(t, err)
	resp, err := http.ReadResponse(pipedR, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.True(t, resp.Close, "the answer closes the connection")
	closedAfter(t, piped, pipedR)

	// The new read timeout bounds a new connection's wait for its request.
	silent, silentR := dial()
	took := closedAfter(t, silent, silentR)
	assert.Greater(t, took, 150*time.Millisecond)
	assert.Less(t, took, 2*time.Second)

	// The first generation's last connection closed: the next reload lets
	// go of its server.
	require.Eventually(t, func() bool { return s.serving() == 3 }, 2*time.Second, 10*time.Millisecond, "fresh, streamed and kept")
	s.SetClientLimits(ClientLimits{MaxBodyBytes: 512, IdleTimeout: time.Minute})
	s.gensMu.Lock()
	assert.Len(t, s.gens, 2, "the second generation (fresh, streamed and kept) and the third")
	s.gensMu.Unlock()
	lower, lowerR := dial()
	status, body = exchangeOn(t, lower, lowerR, chatOf(1<<10, ""))
	assert.Equal(t, http.StatusRequestEntityTooLarge, status)
	assert.Contains(t, body, "(512 bytes)")
	lower.Close()
	status, _ = exchangeOn(t, fresh, freshR, chatOf(8<<10, ""))
	assert.Equal(t, http.StatusOK, status, "read by the second generation's server: its bound")

	// Limits set faster than generations begin to serve: those that never
	// did are let go of too.
	for i := range 50 {
		s.SetClientLimits(ClientLimits{MaxBodyBytes: 1024 + i, IdleTimeout: time.Minute})
	}
	s.gensMu.Lock()
	assert.LessOrEqual(t, len(s.gens), 5, "the second (streamed, kept), the third (fresh), the one serving, the last retired and the current")
	s.gensMu.Unlock()
	status, _ = exchangeOn(t, kept, keptR, chatOf(8<<10, ""))
	assert.Equal(t, http.StatusOK, status, "read by the second generation's server: its bound")
	status, body = exchangeOn(t, kept, keptR, chatOf(8<<10, ""))
	assert.Equal(t, http.StatusRequestEntityTooLarge, status, "moved on to the current generation, past those between")
	assert.Contains(t, body, "(1073 bytes)")
	kept.Close()

	// Shutdown waits for a request of a retired generation under way.
	answered := make(chan int, 1)
	go func() {
		status := 0 // none: the request failed
		if _, err := io.WriteString(fresh, chatOf(200, "X-Slow: 1\r\n")); err == nil {
			if resp, err := http.ReadResponse(freshR, nil); err == nil {
				status = resp.StatusCode
			}
		}
		answered <- status
	}()
	require.Eventually(t, func() bool {
		w, _ := reg.Get(1)
		return w.Occupancy() == 1
	}, 2*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.Shutdown(ctx))
	assert.True(t, slowAnswering.Load(), "Shutdown returned before the second generation's request was answered")
	assert.Equal(t, http.StatusOK, <-answered)
	for _, c := range []net.Conn{fresh, streamed} {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF, "closed by the shutdown")
	}
	assert.Eventually(t, func() bool { return s.serving() == 0 }, time.Second, 5*time.Millisecond, "each close ended")
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}
