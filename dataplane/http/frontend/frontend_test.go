package frontend

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/http/hangup"
	"github.com/fastroute/fastroute/pickers"
	"github.com/puzpuzpuz/xsync/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// How a failed dispatch is told to the client, and whether it may move to
// another worker: a timeout never (the worker may still be working).
func TestTransportFailuresAreNamedAndClassified(t *testing.T) {
	refused := &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	cases := []struct {
		err       error
		says      string
		retryable bool
	}{
		{refused, "connection refused", true},
		{fmt.Errorf("write: %w", syscall.ECONNRESET), "connection reset", true},
		{fasthttp.ErrDialTimeout, "connect timed out (limits.connect_timeout)", true},
		{fasthttp.ErrTimeout, "no answer within limits.first_byte_timeout", false},
		{io.ErrUnexpectedEOF, "connection closed before the answer", true},
		{fasthttp.ErrBodyTooLarge, fasthttp.ErrBodyTooLarge.Error(), false},
	}
	for _, c := range cases {
		assert.Equal(t, c.says, transportFailure(c.err), "%v", c.err)
		assert.Equal(t, c.retryable, retryable(c.err), "%v", c.err)
	}
	assert.True(t, isTimeout(&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}))
	assert.False(t, isTimeout(errors.New("other")))
}

// The pool over a HostClient lends tracked connections and takes them
// back: a released one is lent again, a closed one leaves the set.
func TestHostPoolLendsTrackedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	set := xsync.NewMapOf[net.Conn, struct{}]()
	hc := &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 4, MaxIdleConnDuration: time.Minute,
		Dial: func(addr string) (net.Conn, error) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			tc := &trackedConn{Conn: c, set: set}
			set.Store(tc, struct{}{})
			return tc, nil
		}}
	pool := newHostPool(hc.AcquireConn, hc.ReleaseConn, hc.CloseConn)
	h, c, err := pool.acquire()
	require.NoError(t, err)
	pool.release(h, true)
	h2, c2, err := pool.acquire()
	require.NoError(t, err)
	assert.Same(t, c, c2, "a released connection is lent again")
	pool.release(h2, false)
	assert.Zero(t, set.Size(), "a closed connection leaves the set")
	assert.Zero(t, hc.ConnsCount())
}

// rawWorker answers every request on its connections with answer(i), the
// i-th request it got (from 0), written in the given pieces with pause
// between them.
func rawWorker(t *testing.T, pause time.Duration, answer func(i int) []string) string {
	var n atomic.Int32
	return rawServer(t, func(c net.Conn, _ *http.Request) bool {
		for k, piece := range answer(int(n.Add(1) - 1)) {
			if k > 0 {
				time.Sleep(pause)
			}
			if _, err := c.Write([]byte(piece)); err != nil {
				return false
			}
		}
		return true
	})
}

// rawServer serves every request on its connections, its body read, with
// answer, which writes the answer on c itself; the connection closes once
// answer returns false. It returns the server's address.
func rawServer(t testing.TB, answer func(c net.Conn, req *http.Request) bool) string {
	return serveConns(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if !answer(c, req) {
				return
			}
		}
	})
}

// serveConns listens on loopback until the test ends, serves each
// connection with serve in a goroutine of its own, closing it once serve
// returns, and returns the listener's address.
func serveConns(t testing.TB, serve func(c net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	serveOn(t, ln, serve)
	return ln.Addr().String()
}

// serveOn serves each connection ln accepts until the test ends with serve,
// in a goroutine of its own, closing it once serve returns.
func serveOn(t testing.TB, ln net.Listener, serve func(c net.Conn)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
}

// serveOne starts a front end over one worker at addr (opts completed with
// its selector, a quiet logger and connect and first-byte timeouts; dial,
// when set, replaces its connects; setup, when given, sees the server and
// wraps its listener before it serves) and returns the registry, the server
// and the URL of its chat route.
func serveOne(t testing.TB, addr string, opts Options, dial func(string, time.Duration) (net.Conn, error), setup ...func(*Server, net.Listener) net.Listener) (*dataplane.Registry, *Server, string) {
	reg := dataplane.NewRegistry()
	_, err := reg.Add(dataplane.WorkerSpec{ID: 1, URL: "http://" + addr})
	require.NoError(t, err)
	opts.Selector, err = dataplane.NewSelector(reg, pickers.ModeRoundRobin, 0)
	require.NoError(t, err)
	opts.Policy.ConnectTimeout = cmp.Or(opts.Policy.ConnectTimeout, 2*time.Second)
	opts.Policy.FirstByteTimeout = cmp.Or(opts.Policy.FirstByteTimeout, 5*time.Second)
	opts.Logger = slog.New(slog.DiscardHandler)
	s := New(opts)
	if dial != nil {
		s.dial = dial
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	for _, f := range setup {
		ln = f(s, ln)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return reg, s, "http://" + ln.Addr().String() + "/v1/chat/completions"
}

// A streamed answer passes chunk by chunk however it is framed: chunked
// with its end arriving on its own after a pause (the copy waits for it
// holding no buffer), or a stream request answered with a Content-Length
// body larger than a read buffer, in two pieces. The upstream connection
// is kept for the next request, and occupancy returns to 0.
func TestStreamedAnswersEndHoweverFramed(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	body := `{"id":"x","pad":"` + strings.Repeat("p", 6000) + `"}` // more than a read buffer: streamed
	addr := rawWorker(t, 50*time.Millisecond, func(i int) []string {
		if i%2 == 1 {
			head := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
			return []string{head + body[:3000], body[3000:]}
		}
		return []string{sse + "9\r\ndata: a\n\n\r\n", "9\r\ndata: b\n\n\r\n", "0\r\n\r\n"}
	})
	reg, s, url := serveOne(t, addr, Options{Policy: Policy{Limits: Limits{StreamIdleTimeout: 5 * time.Second}}}, nil)

	for i := 0; i < 4; i++ {
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(got))
		if i%2 == 1 {
			assert.JSONEq(t, body, string(got))
		} else {
			assert.Equal(t, "data: a\n\ndata: b\n\n", string(got))
		}
	}
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
	assert.Equal(t, 1, s.upstreamOf(w).hc.ConnsCount(), "one upstream connection carried every answer")
}

// A burst of requests that each need a new connection to one worker
// connects DialsPerWorker at a time, and every request is answered.
func TestConnectsToAWorkerAreBounded(t *testing.T) {
	const body = `{"id":"x","choices":[]}`
	addr := rawWorker(t, 0, func(int) []string {
		return []string{fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)}
	})
	var inFlight, most, dials atomic.Int32
	reg, _, url := serveOne(t, addr, Options{DialsPerWorker: 3}, func(addr string, timeout time.Duration) (net.Conn, error) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		dials.Add(1)
		time.Sleep(20 * time.Millisecond) // a slow handshake: the burst piles up
		defer inFlight.Add(-1)
		return fasthttp.DialTimeout(addr, timeout)
	})

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	var wg sync.WaitGroup
	for range 24 {
		wg.Go(func() {
			resp, err := client.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
			if !assert.NoError(t, err) {
				return
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode, string(got))
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, most.Load(), int32(3), "connects in flight to the worker")
	assert.Greater(t, dials.Load(), int32(3), "the burst needed more connections than turns")
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// deadlineConn counts the deadlines set on it and reads a byte at a time.
type deadlineConn struct {
	net.Conn
	calls    int
	rd, wd   time.Time
	readable int
}

func (c *deadlineConn) SetDeadline(t time.Time) error { c.calls++; c.rd, c.wd = t, t; return nil }
func (c *deadlineConn) SetReadDeadline(t time.Time) error {
	c.calls++
	c.rd = t
	return nil
}
func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.calls++
	c.wd = t
	return nil
}
func (c *deadlineConn) Read(p []byte) (int, error) { return 1, nil }

// Upstream deadlines are coarse: request after request on one connection
// sets none while the one there is due within an eighth of the timeout
// after the asked one; a stream's reads after the first are held to the
// idle timeout, set at most every eighth of it; no deadline is ever
// earlier than asked.
func TestUpstreamDeadlinesAreCoarse(t *testing.T) {
	dc := &deadlineConn{}
	tc := &trackedConn{Conn: dc}
	const idle = 8 * time.Second
	tc.init(dc)
	first := time.Now().Add(80 * time.Second)
	require.NoError(t, tc.arm(first, 10*time.Second, idle))
	assert.Equal(t, 1, dc.calls, "one call sets both deadlines")
	assert.False(t, dc.rd.Before(first))
	for range 100 { // short answers: one read each
		d := time.Now().Add(80 * time.Second)
		require.NoError(t, tc.arm(d, 10*time.Second, idle))
		_, _ = tc.Read(make([]byte, 1))
		assert.False(t, dc.rd.Before(d), "never earlier than asked")
		assert.False(t, dc.wd.Before(d))
	}
	assert.Equal(t, 1, dc.calls, "no deadline call per request")

	later := time.Now().Add(200 * time.Second) // a longer wait than the one set
	require.NoError(t, tc.arm(later, 25*time.Second, idle))
	assert.Equal(t, 2, dc.calls)

	for range 50 { // a stream: reads after the first wait up to idle
		_, _ = tc.Read(make([]byte, 1))
	}
	assert.Equal(t, 3, dc.calls, "one idle deadline for reads in quick succession")
	assert.WithinDuration(t, time.Now().Add(9*time.Second), dc.rd, time.Second)

	require.NoError(t, tc.arm(time.Time{}, 0, 0))
	assert.True(t, dc.rd.IsZero() && dc.wd.IsZero(), "no limit clears both")
}

// A stream between chunks holds no read buffer: awaitStream lends the
// connection reader's buffer out while it waits for the worker's next bytes,
// with a read before the wait and one after it, and the bytes that come are
// read whole through the same reader.
func TestAStreamThatWaitsLendsItsReadBuffer(t *testing.T) {
	worker, tc := upstreamPair(t)
	require.NotNil(t, tc.raw, "a TCP connection waits without a buffer")
	c := &upCall{conn: tc, connOf: &upstream{hc: &fasthttp.HostClient{}}, br: bufio.NewReaderSize(tc, 4096)}

	_, err := worker.Write([]byte("ab"))
	require.NoError(t, err)
	_, err = c.br.Peek(2)
	require.NoError(t, err)
	c.awaitStream() // bytes buffered: nothing to wait for
	require.Equal(t, 4096, c.br.Size())
	_, _ = c.br.Discard(2)

	var sizes []int // the reader's buffer at each read of the wait, in the waiting goroutine
	tc.fill = func(fd uintptr) bool {
		sizes = append(sizes, c.br.Size())
		return tc.readOnce(fd)
	}
	done := make(chan struct{})
	go func() { defer close(done); c.awaitStream() }()
	time.Sleep(50 * time.Millisecond)
	_, err = worker.Write([]byte("next chunk"))
	require.NoError(t, err)
	<-done
	assert.Equal(t, []int{0, 0}, sizes, "it waited holding no buffer: a read that found nothing, then the one after the wake-up")
	assert.Equal(t, 4096, c.br.Size(), "a buffer is back to read with")
	got, err := c.br.Peek(10)
	require.NoError(t, err)
	assert.Equal(t, "next chunk", string(got))
	_, _ = c.br.Discard(10)

	// The idle deadline bounds the wait, and the read after it says so.
	tc.idle, tc.reads = 30*time.Millisecond, 1
	c.awaitStream()
	_, err = c.br.ReadByte()
	assert.True(t, isTimeout(err), "got %v", err)

	if raceEnabled {
		return
	}
	tc.fill = tc.readOnce
	x := []byte("x")
	require.Zero(t, testing.AllocsPerRun(100, func() {
		tc.rd, tc.idle = time.Time{}, 0
		_ = tc.Conn.SetReadDeadline(time.Time{})
		_, _ = worker.Write(x)
		c.awaitStream()
		_, _ = c.br.ReadByte()
	}), "waiting allocates nothing once a reader is lent")
}

// A worker gone silent mid-stream is cut one idle gap after its last bytes,
// not two: the read after a wait that ran out its deadline fails at that
// deadline, instead of setting a new one and waiting again.
func TestASilentStreamIsCutOneIdleGapAfterItsLastBytes(t *testing.T) {
	worker, tc := upstreamPair(t)
	c := &upCall{conn: tc, connOf: &upstream{hc: &fasthttp.HostClient{}}, br: bufio.NewReaderSize(tc, 4096)}
	const idle = 400 * time.Millisecond
	require.NoError(t, tc.arm(time.Time{}, 0, idle))
	_, err := worker.Write([]byte("head"))
	require.NoError(t, err)
	_, err = c.br.Peek(4) // the answer's first read
	require.NoError(t, err)
	_, _ = c.br.Discard(4)

	start := time.Now()
	c.awaitStream() // the worker sends nothing more
	deadline := tc.rd
	_, err = c.br.ReadByte()
	took := time.Since(start)
	assert.True(t, isTimeout(err), "got %v", err)
	assert.Equal(t, deadline, tc.rd, "the read failed at the deadline the wait ran out")
	assert.Less(t, took, idle*3/2, "cut after one idle gap (and its eighth of slack), not two")
	assert.GreaterOrEqual(t, took, idle)
}

// The buffer a waiting stream lends out goes to its worker's pool of
// readers, where the next request to that worker finds it: streams opened
// while others wait do not each bring a buffer of their own to a pool that
// keeps it.
func TestAWaitingStreamsBufferServesTheNextRequest(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops sync.Pool entries at random")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // one P: its pool is the one the wait gave to
	worker, tc := upstreamPair(t)
	hc := &fasthttp.HostClient{}
	c := &upCall{conn: tc, connOf: &upstream{hc: hc}, br: hc.AcquireReader(tc)}
	streamBuf := readerBuffer(c.br)

	done := make(chan struct{})
	go func() { defer close(done); c.awaitStream() }()
	time.Sleep(50 * time.Millisecond) // it waits, its buffer lent
	next := hc.AcquireReader(tc)
	assert.Equal(t, streamBuf, readerBuffer(next), "the next request reads with the waiting stream's buffer")
	hc.ReleaseReader(next)

	_, err := worker.Write([]byte("chunk"))
	require.NoError(t, err)
	<-done
	got, err := c.br.Peek(5)
	require.NoError(t, err)
	assert.Equal(t, "chunk", string(got))
	assert.Equal(t, streamBuf, readerBuffer(c.br), "and the stream takes one back from the same pool")
}

// readerBuffer is the address of br's buffer.
func readerBuffer(br *bufio.Reader) uintptr {
	return reflect.ValueOf(br).Elem().FieldByName("buf").Pointer()
}

// fasthttp's read of a request's first byte reads the whole request in one
// call; the reads that follow take the rest from it, then from the socket.
func TestAClientRequestIsReadAheadFromItsFirstByte(t *testing.T) {
	client, cc := clientPair(t)
	_, err := cc.SyscallConn()
	require.NoError(t, err, "the hang-up watcher reaches the socket")

	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
	go func() { time.Sleep(20 * time.Millisecond); _, _ = client.Write([]byte(req)) }()
	one := make([]byte, 1)
	n, err := cc.Read(one) // waits for the request
	require.NoError(t, err)
	require.Equal(t, 1, n)
	assert.Equal(t, "P", string(one))
	assert.Equal(t, len(req), cc.n, "the whole request came in the first read")
	rest := make([]byte, 64<<10)
	n, err = cc.Read(rest)
	require.NoError(t, err)
	assert.Equal(t, req[1:], string(rest[:n]))
	assert.Nil(t, cc.buf, "the buffer goes back once read")

	big := strings.Repeat("a", 10<<10) // larger than a read-ahead buffer
	_, err = client.Write([]byte(big))
	require.NoError(t, err)
	var got []byte
	n, err = cc.Read(one)
	require.NoError(t, err)
	got = append(got, one[:n]...)
	for len(got) < len(big) {
		n, err = cc.Read(rest)
		require.NoError(t, err)
		got = append(got, rest[:n]...)
	}
	assert.Equal(t, big, string(got))

	require.NoError(t, cc.SetReadDeadline(time.Now().Add(30*time.Millisecond)))
	_, err = cc.Read(one)
	assert.True(t, isTimeout(err), "an idle connection's deadline ends the wait: %v", err)
	require.NoError(t, cc.SetReadDeadline(time.Now().Add(30*time.Millisecond)))
	_, err = cc.Read(rest)
	assert.True(t, isTimeout(err), "and a read past the read ahead's: %v", err)

	require.NoError(t, cc.SetReadDeadline(time.Time{}))
	require.NoError(t, client.Close())
	_, err = cc.Read(one)
	assert.Equal(t, io.EOF, err, "a client that leaves ends the wait as a read would")
	_, err = cc.Read(rest)
	assert.Equal(t, io.EOF, err)
	if !raceEnabled {
		assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = cc.Read(rest) }), "a read allocates nothing")
	}
}

// A client connection's writes are whole however little room the socket
// has (a write waits for room through the poller), end at the write
// deadline as a timeout, fail as the net package's would on a connection
// the peer reset or this side closed, and allocate nothing.
func TestClientWritesWaitForRoomAndFailAsTheNetPackagesWould(t *testing.T) {
	peer, cc := clientPair(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB: many times the socket's room
	got := make(chan []byte)
	go func() {
		time.Sleep(50 * time.Millisecond) // the writer finds the socket full first
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
		got <- b
	}()
	n, err := cc.Write(big)
	require.NoError(t, err)
	require.Equal(t, len(big), n)
	assert.True(t, bytes.Equal(big, <-got), "the peer read every byte in order")

	if !raceEnabled {
		small := []byte("data: x\n\n")
		assert.Zero(t, testing.AllocsPerRun(100, func() {
			_, _ = cc.Write(small)
			_, _ = io.ReadFull(peer, small)
		}), "a write allocates nothing")
	}

	require.NoError(t, cc.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
	// The peer reads nothing now; its receive buffer, grown by the kernel
	// for the transfer above, may take a few of these writes whole.
	for i := 0; i < 8 && err == nil; i++ {
		n, err = cc.Write(big)
	}
	assert.True(t, isTimeout(err), "the write deadline ends the wait: %v", err)
	assert.Less(t, n, len(big))
	require.NoError(t, cc.SetWriteDeadline(time.Time{}))

	require.NoError(t, peer.(*net.TCPConn).SetLinger(0))
	require.NoError(t, peer.Close()) // a reset, unread bytes and all
	time.Sleep(20 * time.Millisecond)
	_, err = cc.Write([]byte("more"))
	var opErr *net.OpError
	require.ErrorAs(t, err, &opErr)
	assert.Equal(t, "write", opErr.Op)
	assert.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE), "got %v", err)

	require.NoError(t, cc.Close())
	_, err = cc.Write([]byte("more"))
	assert.ErrorIs(t, err, net.ErrClosed)
}

// Data handed from one goroutine to another through a socket is in order
// for the race detector, whichever end makes raw calls: under -race this
// test fails with a data race if the router's reads and writes stop telling
// the detector what the kernel does (internal/rawsock/rawsock_race.go).
func TestGoroutinesThatTalkThroughASocketAreInOrderForTheRaceDetector(t *testing.T) {
	peer, cc := clientPair(t)
	var toPeer, toRouter int // each written by one goroutine, read by the other after the bytes came
	done := make(chan struct{})
	go func() {
		defer close(done)
		toPeer = 1
		_, err := cc.Write([]byte("a")) // raw write, plain read
		assert.NoError(t, err)
		b := make([]byte, 1)
		_, err = cc.Read(b) // plain write, raw read (the read ahead)
		assert.NoError(t, err)
		assert.Equal(t, 2, toRouter)
	}()
	b := make([]byte, 1)
	_, err := io.ReadFull(peer, b)
	require.NoError(t, err)
	assert.Equal(t, 1, toPeer)
	toRouter = 2
	_, err = peer.Write([]byte("b"))
	require.NoError(t, err)
	<-done
}

// A client connection's deadlines go on its socket only before a wait,
// and then coarse: request after request whose bytes are there sets none,
// a wait is still bounded by the deadline asked, and a deadline that
// expired on the socket after it was lifted fails nothing.
func TestClientDeadlinesGoOnTheSocketOnlyBeforeAWait(t *testing.T) {
	peer, cc := clientPair(t)
	one, req := make([]byte, 1), []byte("GET / HTTP/1.1\r\n\r\n")
	for range 20 { // the request is there when read, the answer has room
		require.NoError(t, cc.SetReadDeadline(time.Now().Add(10*time.Second)))
		require.NoError(t, cc.SetWriteDeadline(time.Now().Add(10*time.Second)))
		_, err := peer.Write(req)
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
		_, err = cc.Read(one)
		require.NoError(t, err)
		_, err = cc.Read(make([]byte, 64))
		require.NoError(t, err)
		_, err = cc.Write(req)
		require.NoError(t, err)
		_, err = io.ReadFull(peer, make([]byte, len(req)))
		require.NoError(t, err)
	}
	assert.Zero(t, cc.rdSet, "no read deadline went on the socket")
	assert.Zero(t, cc.wdSet, "no write deadline went on the socket")

	start := time.Now()
	require.NoError(t, cc.SetReadDeadline(start.Add(80*time.Millisecond)))
	_, err := cc.Read(one) // nothing comes
	assert.True(t, isTimeout(err), "the deadline asked bounds the wait: %v", err)
	assert.WithinRange(t, time.Now(), start.Add(80*time.Millisecond), start.Add(80*time.Millisecond+time.Second))
	assert.NotZero(t, cc.rdSet)

	require.NoError(t, cc.SetReadDeadline(time.Time{}))
	go func() { time.Sleep(50 * time.Millisecond); _, _ = peer.Write(req) }()
	_, err = cc.Read(one) // the socket's deadline passed, but none is asked now
	require.NoError(t, err)

	for range 3 { // waits in quick succession: the deadline set serves them all
		require.NoError(t, cc.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err = cc.Read(make([]byte, 64))
		require.NoError(t, err)
		set := cc.rdSet
		go func() { time.Sleep(10 * time.Millisecond); _, _ = peer.Write(req) }()
		_, err = cc.Read(one)
		require.NoError(t, err)
		if set != 0 {
			assert.Equal(t, set, cc.rdSet, "a deadline up to an eighth later than asked serves")
		}
	}
}

// clientPair is a loopbackPair whose accepted end is a client connection.
func clientPair(t *testing.T) (peer net.Conn, cc *clientConn) {
	peer, c := loopbackPair(t, func(ln net.Listener) (net.Conn, error) {
		c, err := ln.Accept()
		if err != nil {
			return nil, err
		}
		return newClientConn(c, nil), nil
	})
	return peer, c.(*clientConn)
}

// upstreamPair is a loopbackPair whose dialed end is an upstream
// connection (no idle deadline) and whose accepted end plays the worker.
func upstreamPair(t *testing.T) (worker net.Conn, tc *trackedConn) {
	conn, worker := loopbackPair(t, func(ln net.Listener) (net.Conn, error) { return ln.Accept() })
	tc = newTrackedConn(conn, xsync.NewMapOf[net.Conn, struct{}]())
	t.Cleanup(func() { _ = tc.Close() })
	return worker, tc
}

// loopbackPair dials a loopback listener and returns both ends: the dialed
// one and the one accept returns; both are closed when the test ends.
func loopbackPair(t *testing.T, accept func(net.Listener) (net.Conn, error)) (dialed, accepted net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	dialed, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	accepted, err = accept(ln)
	require.NoError(t, err)
	t.Cleanup(func() { _ = dialed.Close(); _ = accepted.Close() })
	return dialed, accepted
}

// The worker gets the client's request edited in place: its own host, the
// client's URI as sent, other headers and body, and never the client's Connection: close,
// which closes the client's connection only; the worker's stays open for the
// next request.
func TestTheWorkerGetsTheClientsRequestForItsHost(t *testing.T) {
	type seen struct {
		uri, host, custom, body, proto string
		close                          bool
	}
	got := make(chan seen, 4)
	var conns atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	worker := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got <- seen{r.RequestURI, r.Host, r.Header.Get("X-Custom"), string(b), r.Proto, r.Close}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"ok":true}`))
		}),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		},
	}
	go func() { _ = worker.Serve(ln) }()
	t.Cleanup(func() { _ = worker.Close() })
	_, _, url := serveOne(t, ln.Addr().String(), Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")

	// A target in absolute form (which a client may send any server,
	// RFC 9112 §3.2.2) reaches the worker in origin form, as nginx and Go's
	// reverse proxy send it: the worker never sees the client's idea of a
	// host. An HTTP/1.0 client's request reaches it as HTTP/1.1, on the
	// same kept-alive connection, whether or not the client keeps its own.
	for _, tc := range []struct {
		target, proto, connection string
		closes                    bool
	}{
		{"/v1/chat/completions?v=a%2Fb", "HTTP/1.1", "", false},
		{"/v1/chat/completions?v=a%2Fb", "HTTP/1.1", "close", true},
		{"http://client.example/v1/chat/completions?v=a%2Fb", "HTTP/1.1", "", false},
		{"/v1/chat/completions?v=a%2Fb", "HTTP/1.0", "", true},
		{"/v1/chat/completions?v=a%2Fb", "HTTP/1.0", "keep-alive", false},
	} {
		name := tc.target + " " + tc.proto + " " + tc.connection
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		body := `{"model":"m","messages":[]}`
		head := "POST " + tc.target + " " + tc.proto + "\r\nHost: client.example\r\nX-Custom: kept\r\nContent-Type: application/json\r\n"
		if tc.connection != "" {
			head += "Connection: " + tc.connection + "\r\n"
		}
		_, err = fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, name)
		answer, _ := io.ReadAll(resp.Body)
		assert.Equal(t, `{"ok":true}`, string(answer), name)
		w := <-got
		assert.Equal(t, seen{"/v1/chat/completions?v=a%2Fb", ln.Addr().String(), "kept", body, "HTTP/1.1", false}, w, name)
		if tc.closes {
			_, err := br.ReadByte()
			assert.ErrorIs(t, err, io.EOF, "%s: the client's connection closes after its answer", name)
		} else {
			require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
			_, err := br.ReadByte()
			assert.True(t, isTimeout(err), "%s: the client's connection stays open: %v", name, err)
		}
		_ = c.Close()
	}
	assert.Equal(t, int32(1), conns.Load(), "the worker's connection stays open across all five")
}

// Hop-by-hop headers stay on their connection: the worker never gets the
// client's Keep-Alive, TE, Upgrade, Proxy-Authorization, Proxy-Connection, a
// header the client's Connection header names or its Expect (answered by
// the router), nor a Content-Type the client did not send; the client never gets the worker's Keep-Alive,
// Proxy-Authenticate or a header the worker's Connection names, buffered
// answer or stream. End-to-end headers pass both ways, a client's
// Connection: close still closes its connection, and one connection to the
// worker carries every request.
func TestHopByHopHeadersStayOnTheirConnection(t *testing.T) {
	seen := make(chan http.Header, 4)
	addr := rawServer(t, func(c net.Conn, req *http.Request) bool {
		seen <- req.Header
		hops := "Connection: keep-alive, X-Worker-Hop\r\nKeep-Alive: timeout=5\r\nX-Worker-Hop: 1\r\nProxy-Authenticate: Basic\r\nX-Engine: e1\r\n"
		var err error
		if req.Header.Get("X-Stream") != "" {
			_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"+hops+"\r\n9\r\ndata: a\n\n\r\n0\r\n\r\n")
		} else {
			_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"+hops+"\r\n{}")
		}
		return err == nil
	})
	reg, s, url := serveOne(t, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	const body = `{"model":"m","messages":[]}`
	const hops = "Keep-Alive: 300\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nX-Client-Hop: 1\r\nExpect: 100-continue\r\n"
	for _, tc := range []struct {
		name, connection string
		stream, closes   bool
	}{
		{"buffered, kept", "keep-alive, Upgrade, X-Client-Hop", false, false},
		{"stream, kept", "X-Client-Hop", true, false},
		{"buffered, closed", "close, X-Client-Hop", false, true},
		{"stream, closed", "close, X-Client-Hop", true, true},
	} {
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-Id: s1\r\nCookie: a=1;b=2\r\nConnection: " + tc.connection + "\r\n" + hops
		if tc.stream {
			head += "X-Stream: 1\r\n"
		}
		_, err = fmt.Fprintf(c, "%sContent-Length: %d\r\n\r\n%s", head, len(body), body)
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, tc.name)
		require.Equal(t, http.StatusContinue, resp.StatusCode, "%s: the router meets the client's Expect", tc.name)
		resp, err = http.ReadResponse(br, nil)
		require.NoError(t, err, tc.name)
		_, _ = io.ReadAll(resp.Body)
		assert.Equal(t, "e1", resp.Header.Get("X-Engine"), tc.name)
		for _, h := range []string{"Keep-Alive", "Proxy-Authenticate", "X-Worker-Hop"} {
			assert.Empty(t, resp.Header.Values(h), "%s: the worker's %s", tc.name, h)
		}
		assert.Equal(t, tc.closes, resp.Close, tc.name)
		if tc.closes {
			_, err := br.ReadByte()
			assert.ErrorIs(t, err, io.EOF, "%s: the client's connection is closed after its answer", tc.name)
		}
		_ = c.Close()
		got := <-seen
		assert.Equal(t, "s1", got.Get("X-Session-Id"), tc.name)
		assert.Equal(t, []string{"a=1;b=2"}, got.Values("Cookie"), "%s: end-to-end headers pass as sent", tc.name)
		for _, h := range []string{"Connection", "Keep-Alive", "Te", "Upgrade", "Proxy-Authorization", "Proxy-Connection", "X-Client-Hop", "Content-Type", "Expect"} {
			assert.Empty(t, got.Values(h), "%s: the client's %s", tc.name, h)
		}
	}
	w, _ := reg.Get(1)
	assert.Equal(t, 1, s.upstreamOf(w).hc.ConnsCount(), "one upstream connection carried every request")
	assert.Zero(t, w.Occupancy())
}

// A worker's answer reaches the client with its headers' names as the
// worker sent them (not normalized), without a Content-Type when it had
// none (fasthttp's default, text/plain, is not added), with one Date and
// one Server (the router's, as nginx sends them, whatever the case of the
// worker's: uvicorn writes "date" and "server") and without its hop-by-hop
// headers, whatever their case: buffered or streamed.
func TestAnAnswersHeadersReachTheClientAsTheWorkerSentThem(t *testing.T) {
	const fields = "ETag: \"e1\"\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\nx-request-id: r1\r\nX-ENGINE: e\r\nconnection: keep-alive, x-worker-hop\r\nx-worker-hop: 1\r\nKEEP-ALIVE: timeout=5\r\n"
	addr := rawWorker(t, 0, func(i int) []string {
		if i%2 == 0 {
			return []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + fields + "\r\nok"}
		}
		return []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n" + fields + "\r\n2\r\nok\r\n0\r\n\r\n"}
	})
	reg, s, url := serveOne(t, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	for i, framing := range []string{"Content-Length: 2", "Transfer-Encoding: chunked"} {
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		const body = `{"model":"m","messages":[]}`
		_, err = fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		got, err := io.ReadAll(c)
		require.NoError(t, err)
		_ = c.Close()
		head, answer, ok := strings.Cut(string(got), "\r\n\r\n")
		require.True(t, ok, "answer %d: %q", i, got)
		for _, line := range []string{framing, `ETag: "e1"`, "x-request-id: r1", "X-ENGINE: e", "X-Fastroute-Worker: 1", "Connection: close", "Server: fastroute"} {
			assert.Contains(t, strings.Split(head, "\r\n"), line, "answer %d:\n%s", i, head)
		}
		for _, name := range []string{"content-type:", "x-worker-hop:", "keep-alive", "2026 00:00:00", "uvicorn"} {
			assert.NotContains(t, strings.ToLower(head), name, "answer %d:\n%s", i, head)
		}
		assert.Equal(t, 1, strings.Count(strings.ToLower(head), "\r\ndate: "), "answer %d: one Date:\n%s", i, head)
		assert.Equal(t, 1, strings.Count(strings.ToLower(head), "\r\nserver: "), "answer %d: one Server:\n%s", i, head)
		want := "ok"
		if i == 1 {
			want = "2\r\nok\r\n0\r\n\r\n"
		}
		assert.Equal(t, want, answer, "answer %d", i)
	}
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
	assert.Equal(t, 1, s.upstreamOf(w).hc.ConnsCount(), "the worker's Connection: keep-alive was its own: one connection carried both")
}

// Chunks of a stream that came together leave in one write to the client;
// one that comes later leaves on its own.
func TestChunksThatCameTogetherLeaveTogether(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	burst := strings.Repeat("9\r\ndata: a\n\n\r\n", 5)
	addr := rawWorker(t, 50*time.Millisecond, func(int) []string {
		return []string{sse + burst, "9\r\ndata: b\n\n\r\n0\r\n\r\n"}
	})
	var writes atomic.Int32
	_, _, url := serveOne(t, addr, Options{}, nil, func(_ *Server, ln net.Listener) net.Listener { return writeCounter{ln, &writes} })
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections) // before the server's Shutdown, which would wait for it
	resp, err := client.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, strings.Repeat("data: a\n\n", 5)+"data: b\n\n", string(got))
	assert.Equal(t, int32(2), writes.Load(), "the head and the burst, then the late chunk and the end")
}

// streamRequest is a raw HTTP request for a streamed chat completion.
func streamRequest(proto, extra string) string {
	body := `{"model":"m","stream":true,"messages":[]}`
	return fmt.Sprintf("POST /v1/chat/completions %s\r\nHost: r\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		proto, extra, len(body), body)
}

// A stream is sent from its own goroutine on the client's connection,
// which then serves the client's next requests, streamed or not; the
// connection stays tracked until it closes, and occupancy returns to 0.
func TestAStreamedConnectionServesItsNextRequests(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	const body = `{"ok":true}`
	addr := rawWorker(t, 20*time.Millisecond, func(i int) []string {
		if i == 2 {
			return []string{fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)}
		}
		return []string{sse + "9\r\ndata: a\n\n\r\n", "9\r\ndata: b\n\n\r\n", "0\r\n\r\n"}
	})
	reg, s, url := serveOne(t, addr, Options{}, nil)
	c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions"))
	require.NoError(t, err)
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(c)
	var watch hangup.Conn // the connection's hang-up watch, kept from its first request to its close
	for i, want := range []string{"data: a\n\ndata: b\n\n", "data: a\n\ndata: b\n\n", body, "data: a\n\ndata: b\n\n"} {
		_, err = io.WriteString(c, streamRequest("HTTP/1.1", ""))
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, "answer %d", i)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, want, string(got), "answer %d", i)
		assert.False(t, resp.Close, "answer %d keeps the connection", i)
		assert.Equal(t, "1", resp.Header.Get(headerServedBy))
		if want != body {
			assert.Equal(t, []string{"chunked"}, resp.TransferEncoding)
		}
		s.conns.Range(func(c net.Conn, _ struct{}) bool {
			if i == 0 {
				watch = c.(*clientConn).watch
			}
			assert.Equal(t, watch, c.(*clientConn).watch, "answer %d: a connection given back keeps its watch (no epoll_ctl)", i)
			return true
		})
	}
	assert.NotEqual(t, hangup.Conn{}, watch, "the connection is watched")
	require.Eventually(t, func() bool { return s.takeovers.Load() == 0 }, 5*time.Second, 10*time.Millisecond,
		"a connection given back waits in the gate, no longer taken over")
	assert.Equal(t, 1, s.conns.Size(), "and is watched for its client's hang-up")
	_ = c.Close()
	require.Eventually(t, func() bool { return s.conns.Size() == 0 }, 5*time.Second, 10*time.Millisecond, "until it closes")
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// A stream answers a client that reads HTTP/1.0, one that asks to close,
// and one that sent its next request behind it (pipelined) on a
// connection closed after the answer, which says so.
func TestAStreamClosesTheConnectionsItCannotKeep(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	addr := rawWorker(t, 20*time.Millisecond, func(int) []string {
		return []string{sse + "9\r\ndata: a\n\n\r\n", "9\r\ndata: b\n\n\r\n0\r\n\r\n"}
	})
	reg, s, url := serveOne(t, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	for _, tc := range []struct{ name, send string }{
		{"HTTP/1.0", streamRequest("HTTP/1.0", "")},
		{"Connection: close", streamRequest("HTTP/1.1", "Connection: close\r\n")},
		{"pipelined", streamRequest("HTTP/1.1", "") + streamRequest("HTTP/1.1", "")},
	} {
		resp, got, raw := lastAnswer(t, front, tc.send)
		assert.Equal(t, "data: a\n\ndata: b\n\n", got, tc.name)
		assert.True(t, resp.Close, tc.name)
		assert.Equal(t, tc.name != "HTTP/1.0", slices.Equal(resp.TransferEncoding, []string{"chunked"}), tc.name)
		assert.Equal(t, 1, bytes.Count(raw, []byte("HTTP/1.")), "%s: one answer", tc.name)
	}
	require.Eventually(t, func() bool { return s.takeovers.Load() == 0 }, 5*time.Second, 10*time.Millisecond)
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// lastAnswer sends send on a new connection to the front end at front and
// reads to the connection's end: the first answer, its body, and all that came.
func lastAnswer(t *testing.T, front, send string) (*http.Response, string, []byte) {
	t.Helper()
	c, err := net.Dial("tcp", front)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, send)
	require.NoError(t, err)
	raw, err := io.ReadAll(c)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(got), raw
}

// Shutdown waits for a stream still open (fasthttp no longer counts its
// connection), which ends whole, and its connection is then closed.
func TestShutdownWaitsForOpenStreams(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	addr := rawWorker(t, 150*time.Millisecond, func(int) []string {
		return []string{sse + "9\r\ndata: a\n\n\r\n", "9\r\ndata: b\n\n\r\n", "9\r\ndata: c\n\n\r\n0\r\n\r\n"}
	})
	reg, s, url := serveOne(t, addr, Options{}, nil)
	resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	first := make([]byte, len("data: a\n\n"))
	_, err = io.ReadFull(resp.Body, first)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned with a stream open: %v", err)
	default:
	}
	rest, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, "data: b\n\ndata: c\n\n", string(rest))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return after the stream ended")
	}
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// firstWrite calls seen at the first write to each connection it accepts.
type firstWrite struct {
	net.Listener
	seen func()
}

func (l firstWrite) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return &firstWriteConn{Conn: c, seen: l.seen}, err
}

type firstWriteConn struct {
	net.Conn
	seen func()
	once sync.Once
}

func (c *firstWriteConn) Write(p []byte) (int, error) {
	c.once.Do(c.seen)
	return c.Conn.Write(p)
}

// A stream's exchange ends before the last bytes of its answer leave, so
// that a client that has them finds the router's books closed: occupancy
// is 0 and the request counted when the write of the stream's end begins,
// whether the end came with the stream's first bytes or after a pause.
func TestAStreamsBooksCloseBeforeItsEndLeaves(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	addr := rawWorker(t, 50*time.Millisecond, func(i int) []string {
		if i%2 == 0 {
			return []string{sse + "9\r\ndata: a\n\n\r\n0\r\n\r\n"} // the whole answer at once
		}
		return []string{sse + "9\r\ndata: a\n\n\r\n", "0\r\n\r\n"}
	})
	var reg *dataplane.Registry
	var s *Server
	var atEnd []string // occupancy and requests counted as each end's write began
	var mu sync.Mutex
	reg, s, url := serveOne(t, addr, Options{}, nil, func(_ *Server, ln net.Listener) net.Listener {
		return endWatch{ln, func() {
			w, _ := reg.Get(1)
			mu.Lock()
			atEnd = append(atEnd, fmt.Sprintf("occupancy %d, counted %d", w.Occupancy(), s.Metrics().Requests("/v1/chat/completions", "ok")))
			mu.Unlock()
		}}
	})
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections) // before the server's Shutdown, which would wait for it
	for i := 1; i <= 4; i++ {
		resp, err := client.Post(url, "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, "data: a\n\n", string(got))
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"occupancy 0, counted 1", "occupancy 0, counted 2", "occupancy 0, counted 3", "occupancy 0, counted 4"}, atEnd)
}

// endWatch calls atEnd as a write of a chunked body's end begins on the
// connections it accepts.
type endWatch struct {
	net.Listener
	atEnd func()
}

func (l endWatch) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return endWatchConn{c, l.atEnd}, err
}

type endWatchConn struct {
	net.Conn
	atEnd func()
}

func (c endWatchConn) Write(p []byte) (int, error) {
	if bytes.HasSuffix(p, []byte("0\r\n\r\n")) {
		c.atEnd()
	}
	return c.Conn.Write(p)
}

// A request of a long prompt goes to its worker in one write, and a long
// answer to its client in one, head and body together (fasthttp's 4 KiB
// write buffers took two each).
func TestLongRequestsAndAnswersLeaveInOneWrite(t *testing.T) {
	answer := `{"text":"` + strings.Repeat("a", 20<<10) + `"}`
	addr := rawWorker(t, 0, func(int) []string {
		return []string{fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)}
	})
	var toWorker, toClient atomic.Int32
	dial := func(addr string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout("tcp", addr, timeout)
		return countedConn{c, &toWorker}, err
	}
	_, _, url := serveOne(t, addr, Options{}, dial, func(_ *Server, ln net.Listener) net.Listener { return writeCounter{ln, &toClient} })
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	prompt := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("p", 20<<10) + `"}]}`
	for i := 1; i <= 3; i++ {
		resp, err := client.Post(url, "application/json", strings.NewReader(prompt))
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, answer, string(got))
		assert.Equal(t, int32(i), toWorker.Load(), "request %d: one write to the worker", i)
		assert.Equal(t, int32(i), toClient.Load(), "request %d: one write to the client", i)
	}
}

// A non-streamed answer over AnswerBufferBytes, or of unknown length,
// passes through as it comes instead of being read whole: the worker sends
// the second half only once the client has read most of the first, which
// would never happen behind a router that holds the answer. A known-length
// one within the limit is still read whole and leaves in one write. The
// client gets every byte, framed as the worker framed it (a Content-Length
// kept, an unknown length chunked), and occupancy returns to zero.
func TestAnAnswerOverTheBufferPassesThroughAsItComes(t *testing.T) {
	const limit = 64 << 10
	big := `{"text":"` + strings.Repeat("a", 4*limit) + `"}`
	small := `{"text":"` + strings.Repeat("s", limit/4) + `"}`
	gate := make(chan chan struct{}, 1)
	addr := rawServer(t, func(c net.Conn, req *http.Request) bool {
		const head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
		if req.Header.Get("X-Answer") == "small" {
			_, err := fmt.Fprintf(c, head+"Content-Length: %d\r\n\r\n%s", len(small), small)
			return err == nil
		}
		half, known := len(big)/2, req.Header.Get("X-Answer") == "known"
		if known {
			_, _ = fmt.Fprintf(c, head+"Content-Length: %d\r\n\r\n%s", len(big), big[:half])
		} else {
			_, _ = fmt.Fprintf(c, head+"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", half, big[:half])
		}
		select {
		case <-<-gate: // the client has most of the first half
		case <-time.After(5 * time.Second):
			return false // a router that waits for the whole answer gets it cut
		}
		var err error
		if known {
			_, err = io.WriteString(c, big[half:])
		} else {
			_, err = fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(big)-half, big[half:])
		}
		return err == nil
	})
	var toClient atomic.Int32
	reg, _, url := serveOne(t, addr, Options{Policy: Policy{Limits: Limits{AnswerBufferBytes: limit}}}, nil,
		func(_ *Server, ln net.Listener) net.Listener { return writeCounter{ln, &toClient} })
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	post := func(answer string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"model":"m","messages":[]}`))
		require.NoError(t, err)
		req.Header.Set("X-Answer", answer)
		resp, err := client.Do(req)
		require.NoError(t, err)
		return resp
	}
	for _, answer := range []string{"known", "chunked"} {
		read := make(chan struct{})
		gate <- read
		resp := post(answer)
		require.Equal(t, http.StatusOK, resp.StatusCode, answer)
		first := make([]byte, len(big)/3)
		_, err := io.ReadFull(resp.Body, first)
		require.NoError(t, err, answer)
		close(read)
		rest, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, answer)
		assert.Equal(t, big, string(first)+string(rest), answer)
		if answer == "known" {
			assert.Equal(t, int64(len(big)), resp.ContentLength)
		} else {
			assert.Equal(t, []string{"chunked"}, resp.TransferEncoding)
		}
	}
	before := toClient.Load()
	resp := post("small")
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, small, string(got))
	assert.Equal(t, before+1, toClient.Load(), "an answer within the limit leaves in one write")
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// writeCounter counts the writes to the connections it accepts.
type writeCounter struct {
	net.Listener
	n *atomic.Int32
}

func (l writeCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return countedConn{c, l.n}, err
}

type countedConn struct {
	net.Conn
	n *atomic.Int32
}

func (c countedConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// Once an answer streams, the request is never sent again: its body is let
// go of before the stream's goroutine starts (and fasthttp's request
// context once the take-over returns), not held for as long as the stream
// runs; a buffered answer's request keeps its body to the end.
func TestAStreamDoesNotHoldItsRequestBody(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	addr := rawWorker(t, 20*time.Millisecond, func(i int) []string {
		if i == 1 {
			return []string{"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"}
		}
		return []string{sse + "9\r\ndata: a\n\n\r\n", "0\r\n\r\n"}
	})
	var current atomic.Pointer[fasthttp.RequestCtx]
	var streaming atomic.Bool
	held := make(chan int, 2)
	_, _, url := serveOne(t, addr, Options{}, nil, func(s *Server, ln net.Listener) net.Listener {
		srv := s.current.Load().srv
		handle := srv.Handler
		srv.Handler = func(ctx *fasthttp.RequestCtx) {
			current.Store(ctx)
			handle(ctx)
		}
		// A stream's body as its take-over returns (fasthttp then lets
		// go of the request context).
		newExchange := s.exchanges.New
		s.exchanges.New = func() any {
			ex := newExchange().(*exchange)
			run := ex.runTakenFn
			ex.runTakenFn = func(c net.Conn) {
				ctx := ex.ctx
				run(c)
				held <- len(ctx.Request.Body())
			}
			return ex
		}
		// A buffered answer's body as its first bytes leave, read by
		// fasthttp's goroutine that writes them.
		return firstWrite{ln, func() {
			if !streaming.Load() {
				held <- len(current.Load().Request.Body())
			}
		}}
	})
	prompt := strings.Repeat("p", 32<<10)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // a connection each
	for _, stream := range []bool{true, false} {
		streaming.Store(stream)
		body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":%q}]}`, stream, prompt)
		resp, err := client.Post(url, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n := <-held; stream {
			assert.Zero(t, n, "a streamed answer's request body is released")
		} else {
			assert.Equal(t, len(body), n)
		}
	}
}

// The gate hands fasthttp a connection only once its request came: a new
// connection that sends nothing is closed after read_timeout, one a stream
// gave back after idle_timeout (and forgotten), and Shutdown closes those
// still waiting at once.
func TestTheGateClosesConnectionsThatSendNothing(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	addr := rawWorker(t, 0, func(int) []string { return []string{sse + "9\r\ndata: a\n\n\r\n0\r\n\r\n"} })
	_, s, url := serveOne(t, addr, Options{ClientLimits: ClientLimits{ReadTimeout: 200 * time.Millisecond, IdleTimeout: 400 * time.Millisecond}}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")

	silent, err := net.Dial("tcp", front)
	require.NoError(t, err)
	defer silent.Close()
	took := closedAfter(t, silent, bufio.NewReader(silent))
	assert.Greater(t, took, 150*time.Millisecond)
	assert.Less(t, took, 2*time.Second)

	c, err := net.Dial("tcp", front)
	require.NoError(t, err)
	defer c.Close()
	br := bufio.NewReader(c)
	_, err = io.WriteString(c, streamRequest("HTTP/1.1", ""))
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	got, _ := io.ReadAll(resp.Body)
	assert.Equal(t, "data: a\n\n", string(got))
	took = closedAfter(t, c, br)
	assert.Greater(t, took, 300*time.Millisecond, "idle_timeout, not read_timeout")
	assert.Less(t, took, 2*time.Second)
	require.Eventually(t, func() bool { return s.conns.Size() == 0 }, 2*time.Second, 10*time.Millisecond, "forgotten")

	// No timeouts: a connection waits in the gate until Shutdown.
	_, s, url = serveOne(t, addr, Options{}, nil)
	waiting, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions"))
	require.NoError(t, err)
	defer waiting.Close()
	time.Sleep(50 * time.Millisecond) // accepted into the gate
	assert.Zero(t, s.serving(), "a connection that sent nothing holds no serving goroutine")
	start := time.Now()
	require.NoError(t, s.Shutdown(context.Background()))
	assert.Less(t, time.Since(start), time.Second)
	assert.Less(t, closedAfter(t, waiting, bufio.NewReader(waiting)), time.Second)
}

// An answer read to its connection's close (no length: HTTP/1.0, or
// HTTP/1.1 without Content-Length or chunks) reaches the client as it
// came, and one cut short of its Content-Length is a 502, not an answer
// made whole with bytes read before (a read that met the close returned
// the count of the read before it). One whose head cannot be read is a
// 502 that says why without quoting it.
func TestAnAnswerEndsWhereItsConnectionDid(t *testing.T) {
	answers := map[string]string{
		"/close":   "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"a\":1}",
		"/http10":  "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"a\":1}",
		"/stream":  "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\n",
		"/short":   "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{}",
		"/chunked": "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n7\r\n{\"a\":1}\r\n",
		// Unreadable heads: a 502 that does not quote them.
		"/twolengths": "HTTP/1.1 200 OK\r\nSet-Cookie: s=s3cret\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
		"/longhead":   "HTTP/1.1 200 OK\r\nSet-Cookie: s=s3cret\r\nX-Long: " + strings.Repeat("a", 8<<10) + "\r\nContent-Length: 2\r\n\r\n{}",
	}
	addr := rawServer(t, func(c net.Conn, req *http.Request) bool {
		_, _ = io.WriteString(c, answers[strings.TrimPrefix(req.URL.Path, "/v1/x")])
		return false // and close
	})
	reg, _, url := serveOne(t, addr, Options{}, nil)
	base := strings.TrimSuffix(url, "/chat/completions")
	client := &http.Client{Timeout: 5 * time.Second}
	for _, tc := range []struct {
		path, want string
		status     int
	}{
		{"/close", `{"a":1}`, 200},
		{"/http10", `{"a":1}`, 200},
		{"/stream", "data: a\n\n", 200},
		{"/short", " broke its answer: connection closed mid-answer", 502},
		{"/chunked", `{"a":1}`, 200}, // cut before its last chunk: the client's read fails
		{"/twolengths", " broke its answer: answer headers not valid HTTP", 502},
		{"/longhead", " broke its answer: answer headers larger than the router's read buffer", 502},
	} {
		resp, err := client.Post(base+"/x"+tc.path, "application/json", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err, tc.path)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode, tc.path)
		if tc.path == "/chunked" {
			assert.Error(t, err, "a chunked answer cut short is cut for the client too")
		}
		assert.Equal(t, 1, resp.ProtoMinor, "%s: the router's answer is HTTP/1.1", tc.path)
		if tc.status == 200 {
			assert.Equal(t, tc.want, string(body), tc.path)
		} else {
			assert.Contains(t, string(body), "worker 1"+tc.want, tc.path)
			assert.NotContains(t, string(body), "s3cret", tc.path)
		}
	}
	w, _ := reg.Get(1)
	require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, 10*time.Millisecond)
}

// A request whose client closes before its body is whole is answered 400
// and never reaches a worker: the read that meets the close is not taken
// for more body (it returned the count of the read before it, and the
// request went on, made whole with stale bytes, unless the hang-up watch
// noticed the close first).
func TestARequestCutShortReachesNoWorker(t *testing.T) {
	reg, got, c := dialRecordingWorker(t)
	// A body that is not JSON, forwarded as it is (as audio is).
	_, err := io.WriteString(c, "POST /v1/audio/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\nRIFF")
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond) // read ahead before the close comes
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	ans, _ := io.ReadAll(c)
	assert.True(t, strings.HasPrefix(string(ans), "HTTP/1.1 400 "), "a request the router could not read whole: %q", ans)
	time.Sleep(50 * time.Millisecond)
	assert.Empty(t, got, "the worker got no request")
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// dialRecordingWorker serves a front end of one worker that answers every
// request {} and sends it on got (the requests it had so far: len(got)),
// and returns the registry, got and a connection to the front end.
func dialRecordingWorker(t *testing.T) (*dataplane.Registry, chan *http.Request, net.Conn) {
	got := make(chan *http.Request, 16)
	addr := rawServer(t, func(c net.Conn, req *http.Request) bool {
		got <- req
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		return err == nil
	})
	reg, _, url := serveOne(t, addr, Options{}, nil)
	c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return reg, got, c
}

// A request with a space in a field name ("X Id: 1", which fasthttp takes)
// is answered 400 naming it and reaches no worker; the same request with
// a token for a name passes, on the same connection.
func TestAFieldNameWithASpaceIsRefused(t *testing.T) {
	reg, got, c := dialRecordingWorker(t)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	br := bufio.NewReader(c)
	body := `{"model":"m","messages":[]}`
	for _, tc := range []struct {
		name   string
		status int
		served int
	}{
		{"X Id", http.StatusBadRequest, 0},
		{"X-Id", http.StatusOK, 1},
	} {
		_, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%s: 1\r\nContent-Length: %d\r\n\r\n%s", tc.name, len(body), body)
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err, tc.name)
		answer, _ := io.ReadAll(resp.Body)
		assert.Equal(t, tc.status, resp.StatusCode, "%s: %s", tc.name, answer)
		if tc.status == http.StatusBadRequest {
			assert.Contains(t, string(answer), `header field name \"X Id\" holds a space`)
		}
		assert.Equal(t, tc.served, len(got), tc.name)
	}
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// A request with both Content-Length and Transfer-Encoding: chunked (the
// ground of request smuggling) is read by its chunks, reaches the worker
// framed by its length alone, and its connection closes after the answer,
// as RFC 9112 section 6.1 asks: what followed it on the connection is
// never read as a request.
func TestARequestWithLengthAndChunksClosesItsConnection(t *testing.T) {
	reg, got, c := dialRecordingWorker(t)
	body := `{"model":"m","messages":[]}`
	_, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"+
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", len(body), body)
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	ans, err := io.ReadAll(c)
	require.NoError(t, err, "the connection closes after the answer")
	assert.Equal(t, 1, strings.Count(string(ans), "HTTP/1.1 "), "one answer: %q", ans)
	assert.True(t, strings.HasPrefix(string(ans), "HTTP/1.1 200 "), "%q", ans)
	req := <-got
	assert.Equal(t, int64(len(body)), req.ContentLength)
	assert.Empty(t, req.TransferEncoding)
	assert.Equal(t, "/v1/chat/completions", req.URL.Path)
	assert.Empty(t, got, "the request after it reached no worker")
	w, _ := reg.Get(1)
	assert.Zero(t, w.Occupancy())
}

// An answer that keeps its connection is held for the wait for the
// connection's next request (sockIO.hold), which sends it: it reaches its
// client at once all the same. When the next request came with it
// (pipelined) and waits on a slow worker, the earlier answer leaves
// before that wait; an answer that closes its connection, or one to an
// HTTP/1.0 client, leaves before the close.
func TestAnAnswerLeavesBeforeTheConnectionsNextRequest(t *testing.T) {
	const body = `{"id":"x"}`
	addr := rawWorker(t, 0, func(i int) []string {
		if i == 2 {
			time.Sleep(1500 * time.Millisecond)
		}
		return []string{fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)}
	})
	_, _, url := serveOne(t, addr, Options{}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	request := func(proto, extra string) string {
		b := `{"model":"m","messages":[]}`
		return fmt.Sprintf("POST /v1/chat/completions %s\r\nHost: r\r\n%sContent-Length: %d\r\n\r\n%s", proto, extra, len(b), b)
	}
	c, err := net.Dial("tcp", front)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(c)
	answer := func() string {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return string(got)
	}

	// Held, it leaves all the same: the client sends nothing until it has it.
	_, err = io.WriteString(c, request("HTTP/1.1", ""))
	require.NoError(t, err)
	assert.Equal(t, body, answer())

	sent := time.Now()
	_, err = io.WriteString(c, request("HTTP/1.1", "")+request("HTTP/1.1", "")) // the second to the slow answer
	require.NoError(t, err)
	assert.Equal(t, body, answer())
	assert.Less(t, time.Since(sent), time.Second, "the first answer did not wait for the second (1.5 s)")
	assert.Equal(t, body, answer())
	assert.Greater(t, time.Since(sent), 1400*time.Millisecond)

	for _, tc := range []struct{ proto, extra string }{{"HTTP/1.1", "Connection: close\r\n"}, {"HTTP/1.0", ""}} {
		resp, got, _ := lastAnswer(t, front, request(tc.proto, tc.extra))
		assert.Equal(t, body, got, tc.proto)
		assert.True(t, resp.Close, tc.proto)
	}
}

// A client's next request that comes while the one before is served (it
// pipelines, but not in one write) is answered in its turn. The answer to
// the first leaves from the wait for the next, after the poller forgot
// the request had come: that wait must read before it waits, or the
// request waits unread for the idle timeout and is lost with its
// connection.
func TestARequestThatCameWhileTheOneBeforeWasServedIsAnswered(t *testing.T) {
	addr := rawWorker(t, 0, func(int) []string {
		time.Sleep(100 * time.Millisecond)
		return []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"}
	})
	_, _, url := serveOne(t, addr, Options{ClientLimits: ClientLimits{IdleTimeout: 3 * time.Second}}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	const request = "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 27\r\n\r\n" + `{"model":"m","messages":[]}`
	c, err := net.Dial("tcp", front)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	br := bufio.NewReader(c)
	_, err = io.WriteString(c, request)
	require.NoError(t, err)
	time.Sleep(30 * time.Millisecond) // the first is with the worker
	start := time.Now()
	_, err = io.WriteString(c, request)
	require.NoError(t, err)
	for range 2 {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	assert.Less(t, time.Since(start), time.Second, "the idle timeout is 3 s")
}

// A client that sends its whole request before it reads (as Python's
// http.client does) gets the answer to a request refused before it was
// read whole: 413 for a body over limits.max_body_bytes, 431 for headers
// over limits.max_header_bytes. The connection's close lingers, reading and
// dropping what the client still sends, instead of answering it with a
// reset that would cost the client the answer.
func TestARefusedRequestsAnswerReachesAClientStillSending(t *testing.T) {
	addr := rawWorker(t, 0, func(int) []string { return []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"} })
	_, _, url := serveOne(t, addr, Options{ClientLimits: ClientLimits{MaxBodyBytes: 64 << 10, MaxHeaderBytes: 8 << 10}}, nil)
	front := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/v1/chat/completions")
	for name, tc := range map[string]struct {
		request string
		status  int
	}{
		"body": {fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%s", 8<<20, strings.Repeat("a", 8<<20)),
			http.StatusRequestEntityTooLarge},
		"headers": {"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Pad: " + strings.Repeat("p", 4<<20) + "\r\nContent-Length: 2\r\n\r\n{}",
			http.StatusRequestHeaderFieldsTooLarge},
	} {
		c, err := net.Dial("tcp", front)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		_, err = io.WriteString(c, tc.request)
		require.NoError(t, err, "%s: the whole request was taken", name)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err, name)
		assert.Equal(t, tc.status, resp.StatusCode, name)
		assert.True(t, resp.Close, name)
		c.Close()
	}
}

// A worker that began its answer got the request: an answer whose head
// cannot be read (two lengths, a head past the read buffer, a head its
// connection ends in) is a 502 from that worker, and the request goes
// neither again on another connection to it nor to another worker (after
// the first answer byte, no retry), however long its connection was
// pooled before.
func TestAnAnswerThatBeganIsNotSentAgain(t *testing.T) {
	bad := map[string]string{
		"/twolengths": "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
		"/longhead":   "HTTP/1.1 200 OK\r\nX-Long: " + strings.Repeat("a", 8<<10) + "\r\nContent-Length: 2\r\n\r\n{}",
		"/cuthead":    "HTTP/1.1 200 OK\r\nContent-",
	}
	var got atomic.Int32
	worker := func() string {
		return rawServer(t, func(c net.Conn, req *http.Request) bool {
			got.Add(1)
			if a, ok := bad[strings.TrimPrefix(req.URL.Path, "/v1/x")]; ok {
				_, _ = io.WriteString(c, a)
				return !strings.HasSuffix(a, "Content-") // the cut head's connection ends
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			return true
		})
	}
	reg, s, url := serveOne(t, worker(), Options{Retries: 2}, nil)
	_, err := reg.Add(dataplane.WorkerSpec{ID: 2, URL: "http://" + worker()})
	require.NoError(t, err)
	base := strings.TrimSuffix(url, "/chat/completions")
	post := func(path string) (int, string) {
		resp, err := http.Post(base+"/x"+path, "application/json", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err, path)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for path, reason := range map[string]string{
		"/twolengths": "answer headers not valid HTTP",
		"/longhead":   "answer headers larger than the router's read buffer",
		"/cuthead":    "connection closed mid-answer",
	} {
		for range 4 { // both workers' connections pooled, then a bad answer
			status, _ := post("/ok")
			require.Equal(t, http.StatusOK, status)
		}
		before := got.Load()
		status, body := post(path)
		assert.Equal(t, http.StatusBadGateway, status, path)
		assert.Contains(t, body, " broke its answer: "+reason, path)
		assert.Equal(t, before+1, got.Load(), "%s: the request reached one worker once", path)
	}
	assert.Zero(t, s.metrics.retries.Value(), "no request moved to another worker")
	for _, id := range []uint64{1, 2} {
		w, _ := reg.Get(id)
		require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, 10*time.Millisecond)
	}
}

// An answer that stalls after its first byte (its head half sent) is a
// 504 that names the deadline it ran out: limits.stream_idle_timeout for
// each read after the first, or, with none, the first-byte timeout for
// the whole head.
func TestAnAnswerThatStallsNamesItsDeadline(t *testing.T) {
	addr := rawServer(t, func(c net.Conn, _ *http.Request) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-")
		_, _ = io.Copy(io.Discard, c) // silent until the router gives up
		return false
	})
	for idle, want := range map[time.Duration]string{
		200 * time.Millisecond: "worker 1 broke its answer: nothing more came within limits.stream_idle_timeout",
		0:                      "worker 1 broke its answer: the whole answer did not come within limits.first_byte_timeout",
	} {
		reg, _, url := serveOne(t, addr, Options{Policy: Policy{Limits: Limits{StreamIdleTimeout: idle, FirstByteTimeout: 600 * time.Millisecond}}}, nil)
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode, "idle %v", idle)
		assert.Contains(t, string(body), want)
		w, _ := reg.Get(1)
		require.Eventually(t, func() bool { return w.Occupancy() == 0 }, 2*time.Second, 10*time.Millisecond)
	}
}

// The 400s engines answer a request longer than their context are told
// from their other 400s by what they say.
func TestRefusalsAsLongerAreTold(t *testing.T) {
	for _, body := range []string{
		// vLLM, a prompt and max_tokens over the context, and a prompt alone
		`{"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}}`,
		`{"object":"error","message":"The decoder prompt (length 9000) is longer than the maximum model length of 8192. Make sure that ` + "`max_model_len`" + ` is no smaller than the number of text tokens.","type":"BadRequestError","param":null,"code":400}`,
		// SGLang
		`{"object":"error","message":"The input (9000 tokens) is longer than the model's context length (8192 tokens).","type":"BadRequestError","param":null,"code":400}`,
		`{"object":"error","message":"Requested token count exceeds the model's maximum context length of 8192 tokens. You requested a total of 9000 tokens: 8000 tokens from the input messages and 1000 tokens for the completion.","type":"BadRequestError","param":null,"code":400}`,
		// llama.cpp's llama-server
		`{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}`,
		// OpenAI's code
		`{"error":{"message":"Too long.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`,
	} {
		assert.True(t, refusedAsLonger([]byte(body)), body)
	}
	for _, body := range []string{
		`{"error":{"message":"[{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}]","type":"BadRequestError","param":null,"code":400}}`,
		`{"object":"error","message":"temperature must be non-negative, got -1.0.","type":"BadRequestError","param":null,"code":400}`,
		`{"error":{"message":"The model ` + "`llama`" + ` does not exist.","type":"NotFoundError","param":"model","code":404}}`,
	} {
		assert.False(t, refusedAsLonger([]byte(body)), body)
	}
}
