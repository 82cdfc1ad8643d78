package frontend

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A process out of file descriptors (a flood of connections reached its
// open-files limit) cannot accept a connection; the kernel keeps it queued.
// The gate waits and accepts again, as nginx and net/http do, rather than
// stop serving for good: once descriptors are free, the connection that
// waited meanwhile is served.
func TestTheGateAcceptsAgainOnceFilesAreFree(t *testing.T) {
	addr := rawWorker(t, 0, func(int) []string {
		return []string{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"}
	})
	_, s, url := serveOne(t, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	ask := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
		require.NoError(t, err)
		return c
	}
	answered := func(c net.Conn) {
		t.Helper()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "{}", string(body))
	}
	// A first request opens the worker's connection (kept for the next),
	// so that only the client's connection needs a descriptor below.
	answered(ask())

	// The limit a little above what is open once the descriptors that
	// earlier tests' connections held are closed, and every descriptor
	// under it taken but the one the client's socket takes; any that
	// frees meanwhile is taken too (topUp).
	null, err := os.Open(os.DevNull) // what the descriptors taken are copies of
	require.NoError(t, err)
	defer null.Close()
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	low := lim
	low.Cur = uint64(settledDescriptors(t) + 16)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low))
	var taken []int
	topUp := func() {
		for {
			fd, err := syscall.Dup(int(null.Fd()))
			if err != nil {
				require.ErrorIs(t, err, syscall.EMFILE)
				return
			}
			taken = append(taken, fd)
		}
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
			for _, fd := range taken {
				_ = syscall.Close(fd)
			}
		}
	}
	defer restore()
	topUp()
	require.NotEmpty(t, taken)
	_ = syscall.Close(taken[len(taken)-1])
	taken = taken[:len(taken)-1]
	c := ask()
	require.Eventually(t, func() bool {
		topUp()
		return s.metrics.acceptShortages.Value() > 0
	}, 2*time.Second, 5*time.Millisecond, "the accept ran into the limit")
	restore()
	answered(c) // the client's connection, queued meanwhile, is served
}

// settledDescriptors returns how many descriptors the process has open once
// the count stays the same for 50 ms (closes that other tests' ends of
// their connections started are done).
func settledDescriptors(t *testing.T) int {
	count := func() int {
		open, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(open) - 1 // less the listing's own
	}
	n := count()
	for range 40 {
		time.Sleep(50 * time.Millisecond)
		m := count()
		if m == n {
			break
		}
		n = m
	}
	return n
}

// With limits.max_connections client connections open the gate accepts no
// more: the next waits in the listen queue, as HAProxy's maxconn has it,
// and is served once one closes, however it closes (the client's close of
// a kept connection, mid-stream or after its stream ended, the router's
// close of a connection whose request asked for it). A new bound applies
// at the next accept (SetMaxConnections: a reload's). The count of open
// connections returns to 0.
func TestMaxConnectionsHoldsTheNextInTheListenQueue(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	addr := rawServer(t, func(c net.Conn, req *http.Request) bool {
		if req.Header.Get("X-Stream") == "" {
			_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			return err == nil
		}
		if _, err := io.WriteString(c, sse+"9\r\ndata: a\n\n\r\n"); err != nil {
			return false
		}
		time.Sleep(300 * time.Millisecond)
		_, err := io.WriteString(c, "9\r\ndata: b\n\n\r\n0\r\n\r\n")
		return err == nil
	})
	_, s, url := serveOne(t, addr, Options{MaxConnections: 2}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	assert.Equal(t, 2, s.MaxConnections())
	dial := func(extra string) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"+extra+"Content-Length: 2\r\n\r\n{}")
		require.NoError(t, err)
		return c, bufio.NewReader(c)
	}
	answered := func(c net.Conn, br *bufio.Reader, within time.Duration) (string, error) {
		t.Helper()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(within)))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return "", err
		}
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}
	queuedAt := func(open int64) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, br := dial("")
		_, err := answered(c, br, 300*time.Millisecond)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "not accepted while %d are open", open)
		assert.NotZero(t, s.metrics.connectionsFull.Value(), "the listener stopped")
		assert.EqualValues(t, open, s.OpenConnections())
		return c, br
	}
	queued := func() (net.Conn, *bufio.Reader) { return queuedAt(2) }
	queued1 := func() (net.Conn, *bufio.Reader) { return queuedAt(1) }

	// Two kept connections: one served by fasthttp, one whose answer was a
	// stream (taken over, then given back).
	kept, br := dial("")
	body, err := answered(kept, br, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "{}", body)
	streamed, sbr := dial("X-Stream: 1\r\n")
	body, err = answered(streamed, sbr, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "data: a\n\ndata: b\n\n", body)

	next, nbr := queued()
	streamed.Close() // after its stream: the gate's wait closes it
	body, err = answered(next, nbr, 5*time.Second)
	require.NoError(t, err, "accepted once one closed")
	assert.Equal(t, "{}", body)

	// One closed mid-stream by its client.
	next.Close()
	midway, mbr := dial("X-Stream: 1\r\n")
	require.NoError(t, midway.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(mbr, nil)
	require.NoError(t, err)
	_, err = resp.Body.Read(make([]byte, 9))
	require.NoError(t, err)
	next, nbr = queued()
	midway.Close()
	body, err = answered(next, nbr, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "{}", body)

	// One the router closes, as its request asked.
	next.Close()
	closing, cbr := dial("Connection: close\r\n")
	_, err = answered(closing, cbr, 5*time.Second)
	require.NoError(t, err)
	_, err = cbr.ReadByte()
	require.ErrorIs(t, err, io.EOF)

	// A bound a reload lowered holds the next connection back; one it
	// raised lets it in at once, with no other connection closing.
	closing.Close()
	s.SetMaxConnections(1)
	assert.Equal(t, 1, s.MaxConnections())
	next, nbr = queued1()
	s.SetMaxConnections(3)
	body, err = answered(next, nbr, 5*time.Second)
	require.NoError(t, err, "accepted once the bound was raised")
	assert.Equal(t, "{}", body)
	assert.EqualValues(t, 2, s.OpenConnections())

	kept.Close()
	next.Close()
	require.Eventually(t, func() bool { return s.OpenConnections() == 0 }, 5*time.Second, 10*time.Millisecond,
		"every connection counted closed once")
}

// A drain (Shutdown) stops accepting at once but serves the requests on
// their way: that of a connection accepted before, sent after, and the
// next request of a kept-alive connection, whether its last answer was
// streamed (taken over from fasthttp, given back to the gate) or not
// (idle in fasthttp), each answered as its connection's last (Connection:
// close). Closed at once, such a connection would fail a request its
// client had sent (an upgrade's new process serves the connection the
// client opens next). One that sends nothing is closed once drainLinger
// passed, and occupancy returns to 0.
func TestADrainServesTheRequestsOnTheirWay(t *testing.T) {
	addr := streamOrPlainWorker(t)
	reg, s, url := serveOne(t, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	type client struct {
		name   string
		c      net.Conn
		br     *bufio.Reader
		stream bool
	}
	send := func(cl *client) *http.Response {
		req := streamRequest("HTTP/1.1", "X-Want: sse\r\n")
		if !cl.stream {
			req = plainRequest()
		}
		_, err := io.WriteString(cl.c, req)
		require.NoError(t, err, cl.name)
		resp, err := http.ReadResponse(cl.br, nil)
		require.NoError(t, err, cl.name)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err, cl.name)
		assert.Equal(t, http.StatusOK, resp.StatusCode, cl.name)
		if cl.stream {
			assert.Equal(t, "data: a\n\n", string(got), cl.name)
		} else {
			assert.Equal(t, `{"ok":true}`, string(got), cl.name)
		}
		return resp
	}
	dial := func(name string, stream bool) *client {
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return &client{name: name, c: c, br: bufio.NewReader(c), stream: stream}
	}
	streamed, plainKept := dial("kept-alive after a stream", true), dial("kept-alive after a plain answer", false)
	for _, cl := range []*client{streamed, plainKept} {
		assert.False(t, send(cl).Close, "%s: kept alive before the drain", cl.name)
	}
	early, silent := dial("accepted before the drain, its request sent after", true), dial("silent", false)
	time.Sleep(50 * time.Millisecond) // both accepted into the gate

	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	_, err := net.DialTimeout("tcp", front, time.Second)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED, "the listener closed at once")
	for _, cl := range []*client{streamed, plainKept, early} {
		assert.True(t, send(cl).Close, "%s: the answer closes the connection", cl.name)
		require.NoError(t, cl.c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err := cl.br.ReadByte()
		assert.ErrorIs(t, err, io.EOF, cl.name)
	}
	require.NoError(t, silent.c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = silent.br.ReadByte()
	assert.ErrorIs(t, err, io.EOF)
	assert.Greater(t, time.Since(start), drainLinger-50*time.Millisecond, "a silent connection lingers")
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	assert.Less(t, time.Since(start), 2*time.Second)
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// A client connection carries limits.max_requests_per_connection
// requests: the last one's answer says Connection: close and the
// connection closes after it, whether fasthttp served its answer or a
// stream was taken over for it (its head says so then); the ones before
// keep it alive.
func TestAConnectionCarriesMaxRequests(t *testing.T) {
	addr := streamOrPlainWorker(t)
	reg, _, url := serveOne(t, addr, Options{Policy: Policy{Limits: Limits{MaxRequestsPerConnection: 3}}}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	for _, last := range []string{"plain", "stream"} {
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		defer c.Close()
		br := bufio.NewReader(c)
		requests := []string{streamRequest("HTTP/1.1", "X-Want: sse\r\n"), plainRequest(), plainRequest()}
		if last == "stream" {
			requests = []string{plainRequest(), plainRequest(), streamRequest("HTTP/1.1", "X-Want: sse\r\n")}
		}
		for i, req := range requests {
			_, err := io.WriteString(c, req)
			require.NoError(t, err)
			resp, err := http.ReadResponse(br, nil)
			require.NoError(t, err, "%s: request %d", last, i+1)
			_, err = io.ReadAll(resp.Body)
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, i == 2, resp.Close, "%s: request %d closes the connection", last, i+1)
		}
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err = br.ReadByte()
		assert.ErrorIs(t, err, io.EOF, last)
	}
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// streamOrPlainWorker is a worker on loopback that answers a stream of one
// event to a request with "X-Want: sse" (streamRequest's extra header) and
// a JSON body of {"ok":true} to any other; it returns its address.
func streamOrPlainWorker(t *testing.T) string {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n0\r\n\r\n"
	const plain = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}"
	return rawServer(t, func(c net.Conn, req *http.Request) bool {
		answer := plain
		if req.Header.Get("X-Want") == "sse" {
			answer = sse
		}
		_, err := io.WriteString(c, answer)
		return err == nil
	})
}

// plainRequest is a non-streaming chat request, as a client writes it.
func plainRequest() string {
	body := `{"model":"m","messages":[]}`
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}
