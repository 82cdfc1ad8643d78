package frontend

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// connWorker is a raw worker that answers the i-th request with the
// pieces answer gives (a pause between them) and tells which connection
// each request came on.
func connWorker(t *testing.T, answer func(i int) []string) (addr string, connOf func(i int) net.Addr) {
	var mu sync.Mutex
	var conns []net.Addr
	addr = rawServer(t, func(c net.Conn, _ *http.Request) bool {
		mu.Lock()
		i := len(conns)
		conns = append(conns, c.RemoteAddr())
		mu.Unlock()
		for k, piece := range answer(i) {
			if k > 0 {
				time.Sleep(20 * time.Millisecond)
			}
			if _, err := c.Write([]byte(piece)); err != nil {
				return false
			}
		}
		return true
	})
	return addr, func(i int) net.Addr {
		mu.Lock()
		defer mu.Unlock()
		return conns[i]
	}
}

// postStream asks url for a stream and returns the body the client got
// and what its read met.
func postStream(t *testing.T, url string) (string, error) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	got, err := io.ReadAll(resp.Body)
	return string(got), err
}

// A stream relayed from the worker's socket reaches the client as the
// worker framed it, however its bytes come apart: a size line cut in two,
// extensions, sizes in capitals, a chunk larger than a read buffer,
// trailer fields (dropped). Its upstream connection serves the next
// request, unless the worker sent bytes past its answer: then that
// connection closes and the next request takes a new one. Occupancy
// returns to zero.
func TestARelayedStreamTakesAnyFramingFromItsWorker(t *testing.T) {
	big := strings.Repeat("b", 9000)
	events := []string{sseHead + "9\r", "\ndata: a\n\n\r\n", "9;n=v\r\ndata: b\n\n\r\nA\r\ndata: cc\n\n\r\n",
		fmt.Sprintf("%X\r\n%s\r\n", len(big), big), "0\r\nX-Trailer: t\r\n\r\n"}
	want := "data: a\n\ndata: b\n\ndata: cc\n\n" + big
	addr, connOf := connWorker(t, func(i int) []string {
		if i == 1 {
			return []string{sseHead + "9\r\ndata: a\n\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"}
		}
		return events
	})
	reg, _, url := serveOne(t, addr, Options{Policy: Policy{Limits: Limits{StreamIdleTimeout: 5 * time.Second}}}, nil)

	for i, wantBody := range []string{want, "data: a\n\n", want} {
		got, err := postStream(t, url)
		require.NoError(t, err)
		assert.Equal(t, wantBody, got, "request %d", i)
	}
	assert.Equal(t, connOf(0), connOf(1), "the first stream's connection carried the second")
	assert.NotEqual(t, connOf(1), connOf(2), "bytes past an answer closed its connection")
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// A chunked answer whose framing breaks mid-stream ends the client's
// stream with an SSE error event that says so, after every event before
// the break, and without the last chunk (the client sees the stream cut).
// The worker's answer counts as cut, and occupancy returns to zero.
func TestABrokenChunkEndsTheStreamWithAnErrorEvent(t *testing.T) {
	addr := rawWorker(t, 20*time.Millisecond, func(int) []string {
		return []string{sseHead + "9\r\ndata: a\n\n\r\n", "zz\r\n"}
	})
	reg, s, url := serveOne(t, addr, Options{Policy: Policy{Limits: Limits{StreamIdleTimeout: 5 * time.Second}}}, nil)
	got, err := postStream(t, url)
	require.Error(t, err, "cut for the client")
	before, event, ok := strings.Cut(got, "\n\ndata: {\"error\":")
	require.True(t, ok, "an error event: %q", got)
	assert.Equal(t, "data: a\n\n", before)
	assert.Contains(t, event, "worker 1 broke the stream: malformed chunked answer")
	w, _ := reg.Get(1)
	assert.EqualValues(t, 1, s.statsOf(w).failures[failCut].Value())
	assert.Zero(t, w.Occupancy())
}

// A client that takes a long stream slower than its worker sends it (it
// reads nothing for a while, through a small receive buffer) gets every
// byte in order: the relay stops when the client has no room and waits for
// room before it reads the worker again.
func TestARelayedStreamWaitsForASlowClient(t *testing.T) {
	const chunks, size = 128, 64 << 10 // 8 MiB: more than the socket buffers hold
	var pieces []string
	var want strings.Builder
	for i := range chunks {
		data := strings.Repeat(string(rune('a'+i%26)), size)
		want.WriteString(data)
		pieces = append(pieces, fmt.Sprintf("%x\r\n%s\r\n", size, data))
	}
	pieces[0] = sseHead + pieces[0]
	pieces = append(pieces, "0\r\n\r\n")
	addr := rawServer(t, func(c net.Conn, _ *http.Request) bool {
		_, err := io.WriteString(c, strings.Join(pieces, ""))
		return err == nil
	})
	reg, _, url := serveOne(t, addr, Options{ClientLimits: ClientLimits{WriteTimeout: 5 * time.Second}, Policy: Policy{Limits: Limits{StreamIdleTimeout: 5 * time.Second}}}, nil)

	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10)
		})
	}}
	c, err := d.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions"))
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, streamRequest("HTTP/1.1", ""))
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // the router fills the client's buffers
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, want.Len(), len(got))
	assert.True(t, want.String() == string(got), "every byte, in order")
	w, _ := reg.Get(1)
	assert.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, time.Millisecond)
}

// A relayed stream whose worker goes silent is cut one idle gap
// (stream_idle_timeout, and at most an eighth more) after its last bytes:
// the client gets the events before, then the error event that says why,
// and the stream's end. The worker's answer counts as cut.
func TestARelayedSilentStreamIsCutOneIdleGapAfterItsLastBytes(t *testing.T) {
	const idle = 600 * time.Millisecond
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	addr := rawServer(t, func(c net.Conn, _ *http.Request) bool {
		_, _ = io.WriteString(c, sseHead+"9\r\ndata: a\n\n\r\n")
		time.Sleep(idle / 2)
		_, _ = io.WriteString(c, "9\r\ndata: b\n\n\r\n")
		<-release // silent from here
		return false
	})
	reg, s, url := serveOne(t, addr, Options{Policy: Policy{Limits: Limits{StreamIdleTimeout: idle}}}, nil)
	start := time.Now()
	got, err := postStream(t, url)
	took := time.Since(start)
	require.NoError(t, err, "a stream the router cut ends cleanly")
	before, event, ok := strings.Cut(got, "\n\ndata: {\"error\":")
	require.True(t, ok, "an error event: %q", got)
	assert.Equal(t, "data: a\n\ndata: b\n\n", before)
	assert.Contains(t, event, "limits.stream_idle_timeout")
	assert.GreaterOrEqual(t, took, idle/2+idle, "not before a whole idle gap after the last bytes")
	assert.Less(t, took, idle/2+idle*3/2, "one idle gap (and its eighth), not two")
	w, _ := reg.Get(1)
	assert.EqualValues(t, 1, s.statsOf(w).failures[failCut].Value())
	assert.Zero(t, w.Occupancy())
}

// A worker that dies right after a chunk (its last bytes and its close
// come together, so the read that takes the bytes also takes the close)
// breaks the client's stream at once, with the error event, not after the
// idle timeout: the watch for the worker's close wakes the relay's wait
// (workerClosed).
func TestAWorkerThatClosesRightAfterAChunkBreaksTheStreamAtOnce(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, _ *http.Request) bool {
		_, _ = io.WriteString(c, sseHead+"9\r\ndata: a\n\n\r\n")
		time.Sleep(50 * time.Millisecond) // the relay waits for more
		_, _ = io.WriteString(c, "9\r\ndata: b\n\n\r\n")
		return false // closed at once
	})
	reg, _, url := serveOne(t, addr, Options{Policy: Policy{Limits: Limits{StreamIdleTimeout: 10 * time.Second}}}, nil)
	for range 10 { // the close comes with the last bytes in most tries, not all
		start := time.Now()
		got, err := postStream(t, url)
		require.Error(t, err, "cut for the client")
		assert.Less(t, time.Since(start), 5*time.Second, "broken at once, not at the idle timeout")
		assert.True(t, strings.HasPrefix(got, "data: a\n\ndata: b\n\n\n\ndata: {\"error\":"), "%q", got)
	}
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}
