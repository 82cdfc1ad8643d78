package frontend

import (
	"bufio"
	"cmp"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/http/hangup"
	"github.com/puzpuzpuz/xsync/v3"
	"github.com/valyala/fasthttp"
)

// upstream is the keep-alive connection pool of one worker. fasthttp's
// HostClient keeps the pool (dialing, the connection limit, idle cleaning);
// the round trip is the front end's own (exchange.send), so an exchange
// knows the connection its request is on and can cut it when its client
// hangs up.
type upstream struct {
	hc    *fasthttp.HostClient
	conns connPool
	// connect opens a connection of the worker's own, outside the pool
	// (a WebSocket tunnel's), in its turn among the connects in flight to
	// the worker (DialsPerWorker), as the pool's are.
	connect  func() (net.Conn, error)
	host     string
	idHeader []byte // worker id as header text
	stats    *workerStats
}

// connPool lends the pooled connections of one worker. The handle is
// fasthttp's record of the connection, whose type is not exported.
type connPool interface {
	acquire() (handle any, c *trackedConn, err error)
	release(handle any, reuse bool) // reuse false: close it
}

// hostPool is a connPool over a HostClient's methods, with fasthttp's
// connection record type C inferred from them.
type hostPool[C interface{ Conn() net.Conn }] struct {
	acquireConn            func(reqTimeout time.Duration, connectionClose bool) (C, error)
	releaseConn, closeConn func(C)
}

func newHostPool[C interface{ Conn() net.Conn }](acquire func(time.Duration, bool) (C, error), release, closeConn func(C)) connPool {
	return &hostPool[C]{acquireConn: acquire, releaseConn: release, closeConn: closeConn}
}

// acquire lends the connection released last, or a new one. A pooled
// connection its worker closed while it idled (the worker's keep-alive
// timeout ran out: uvicorn's, under vLLM and SGLang, is 5 s) is not lent: a
// request sent on it would be lost, and sent again once the worker's close
// came back (send), a round trip later. The close watch closed it already
// (workerClosed), or, seen too late for that, it is closed here.
func (p *hostPool[C]) acquire() (any, *trackedConn, error) {
	for {
		cc, err := p.acquireConn(0, false)
		if err != nil {
			return nil, nil, err
		}
		tc := cc.Conn().(*trackedConn)
		if !tc.lend() { // closed and counted by the watch: only fasthttp's record is left
			p.closeConn(cc)
			continue
		}
		if !tc.closedSeen() {
			return cc, tc, nil
		}
		p.closeConn(cc)
		tc.countClosedByWorker()
	}
}

// release pools the connection for the next request (reuse), watched for
// its worker's close while it idles (trackedConn.pool), or closes it.
func (p *hostPool[C]) release(h any, reuse bool) {
	cc := h.(C)
	if !reuse {
		p.closeConn(cc)
		return
	}
	if tc := cc.Conn().(*trackedConn); !tc.pool() { // its worker closed it already
		p.closeConn(cc)
		tc.countClosedByWorker()
		return
	}
	p.releaseConn(cc)
}

// DefaultDialsPerWorker is the connects in flight to one worker. A burst
// of thousands of new streams would otherwise send a worker thousands of
// SYNs at once: past the kernel's listen queues (tcp_max_syn_backlog,
// somaxconn) connects are dropped, retried a second and then three seconds
// later, and time out — and the worker is ejected for failures that are
// only the burst's. Queued here, the connects go at the
// pace the worker accepts them.
const DefaultDialsPerWorker = 128

// DefaultAnswerBufferBytes is the largest non-streamed answer read whole
// before it is sent when Options.AnswerBufferBytes is not set.
const DefaultAnswerBufferBytes = 1 << 20

// Write buffers, lent only while a request goes to a worker or an answer
// to a client: what fits goes in one write. A prompt of a few thousand
// tokens, or a long answer, took two (the head and the start of the body,
// then the rest) with fasthttp's 4 KiB.
const (
	requestWriteBuffer = 32 << 10
	answerWriteBuffer  = 32 << 10
)

// errDialQueue fails a connect that waited its turn for too long.
var errDialQueue = errors.New("waited limits.first_byte_timeout for a turn to connect (too many connects in flight)")

func (s *Server) upstreamOf(w *dataplane.Worker) *upstream {
	if u, ok := s.upstreams.Load(w); ok {
		return u
	}
	u, _ := s.upstreams.LoadOrCompute(w, func() *upstream {
		spec := w.Spec()
		host := spec.Host()
		stats := newWorkerStats()
		// Connections go to the spec's address (fasthttp's would take
		// port 80 for an https:// URL that names none), or its socket.
		addr, dial := spec.Address(), s.dial
		switch sock := spec.Socket(); {
		case sock != "":
			dial = func(_ string, timeout time.Duration) (net.Conn, error) { return net.DialTimeout("unix", sock, timeout) }
		case spec.TLS():
			confs := &workerTLSConfs{hostname: spec.Hostname()}
			dial = tlsDialer(s.dial, func() *tls.Config { return confs.of(s.workerTLS.Load()) })
		}
		turns := make(chan struct{}, cmp.Or(s.opts.DialsPerWorker, DefaultDialsPerWorker))
		connect := func() (net.Conn, error) {
			lim := &s.policy.Load().Limits // as in force now
			if err := takeTurn(turns, lim.FirstByteTimeout); err != nil {
				return nil, err
			}
			c, err := dialAside(dial, addr, lim.ConnectTimeout)
			<-turns
			if err == nil {
				stats.connects.Inc()
			}
			return c, err
		}
		hc := &fasthttp.HostClient{
			Addr:                host,
			MaxConns:            4096,
			MaxIdleConnDuration: 90 * time.Second,
			// The connection released last is lent first, as nginx's
			// keepalive cache does: the others idle, and those the worker
			// does not close first close after MaxIdleConnDuration,
			// instead of each being kept alive by its turn in a round.
			ConnPoolStrategy: fasthttp.LIFO,
			WriteBufferSize:  requestWriteBuffer,
			Dial: func(string) (net.Conn, error) {
				c, err := connect()
				if err != nil {
					return nil, err
				}
				tc := newTrackedConn(c, s.upConns)
				tc.stats = stats
				stats.open.Add(1)
				tc.watchCloses(s.upCloses)
				s.upConns.Store(tc, struct{}{})
				return tc, nil
			},
		}
		return &upstream{
			hc:       hc,
			conns:    newHostPool(hc.AcquireConn, hc.ReleaseConn, hc.CloseConn),
			connect:  connect,
			host:     host,
			idHeader: strconv.AppendUint(nil, w.ID(), 10),
			stats:    stats,
		}
	})
	return u
}

// dialAside connects from a goroutine of its own. A connect's calls run
// deep: made from a stream's goroutine, they would grow its stack to twice
// its size for as long as the stream runs.
func dialAside(dial func(string, time.Duration) (net.Conn, error), addr string, timeout time.Duration) (net.Conn, error) {
	type dialed struct {
		c   net.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		c, err := dial(addr, timeout)
		done <- dialed{c, err}
	}()
	d := <-done
	return d.c, d.err
}

// workerTLS is conf (nil: the defaults) for connections to the worker
// named hostname: its server name, unless conf names one, is hostname,
// and it resumes sessions from a cache of its own (a cache shared by the
// workers would key them all by a server name conf names, and offer one
// worker another's).
func workerTLS(conf *tls.Config, hostname string) *tls.Config {
	if conf == nil {
		conf = &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	}
	conf = conf.Clone()
	if conf.ServerName == "" {
		conf.ServerName = hostname
	}
	conf.ClientSessionCache = tls.NewLRUClientSessionCache(workerSessions)
	return conf
}

// workerSessions is the TLS sessions kept per worker for resumption.
const workerSessions = 16

// SetWorkerTLS replaces Options.WorkerTLS (a reload): the next connection
// to an https:// worker is made under conf, with a session cache of its
// own (a session resumed would skip checks conf may have changed); those
// open keep theirs.
func (s *Server) SetWorkerTLS(conf *tls.Config) { s.workerTLS.Store(conf) }

// workerTLSConfs is the configuration of one worker's connections
// (workerTLS), made again from the front end's when a reload replaced it.
type workerTLSConfs struct {
	hostname string
	cur      atomic.Pointer[[2]*tls.Config] // the front end's, and the worker's made from it
}

// of returns the worker's configuration made from base.
func (w *workerTLSConfs) of(base *tls.Config) *tls.Config {
	if p := w.cur.Load(); p != nil && p[0] == base {
		return p[1]
	}
	conf := workerTLS(base, w.hostname)
	w.cur.Store(&[2]*tls.Config{base, conf})
	return conf
}

// tlsDialer returns dial followed by a TLS handshake under the
// configuration conf returns, both within the dial's timeout. A handshake
// that fails fails the connect (a worker whose certificate is not trusted
// is unreachable), closed.
func tlsDialer(dial func(string, time.Duration) (net.Conn, error), conf func() *tls.Config) func(string, time.Duration) (net.Conn, error) {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		start := time.Now()
		c, err := dial(addr, timeout)
		if err != nil {
			return nil, err
		}
		if timeout > 0 {
			_ = c.SetDeadline(start.Add(timeout))
		}
		tc := tls.Client(c, conf())
		if err := tc.Handshake(); err != nil {
			_ = c.Close()
			return nil, &net.OpError{Op: "dial", Net: "tcp+tls", Addr: c.RemoteAddr(), Err: err}
		}
		_ = c.SetDeadline(time.Time{})
		return tc, nil
	}
}

// takeTurn waits for a place in turns, up to wait (0: no limit).
func takeTurn(turns chan struct{}, wait time.Duration) error {
	select {
	case turns <- struct{}{}:
		return nil
	default:
	}
	var timeout <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case turns <- struct{}{}:
		return nil
	case <-timeout:
		return errDialQueue
	}
}

// upCall is one request to a worker and its answer, on one pooled
// connection of the worker's upstream.
type upCall struct {
	up         *fasthttp.Request // the request sent (prepare)
	resp       fasthttp.Response
	conn       *trackedConn
	connHandle any       // its pool record
	connOf     *upstream // its pool
	br         *bufio.Reader
	shell      *bufio.Reader               // an empty reader that takes br's buffer to the pool while a stream waits (awaitStream)
	bodyDone   bool                        // the answer's body was read to its end
	upConn     atomic.Pointer[trackedConn] // conn, for the goroutine that may cut it
}

// errStopped ends a dispatch stopped from outside: its client closed its
// connection, or its prefill failed.
var errStopped = errors.New("the request was stopped")

// answerBroke is the failure of a call whose worker began its answer (a
// byte of it came) and broke it before the router had what it reads
// whole: the head (sendOn), or a body read whole (readWhole, prefilled).
// The worker got the request, so it goes neither again on another
// connection nor to another worker (send, retryable): after the first
// byte, no retry.
type answerBroke struct {
	err error
	// The head's bytes were at fault, not the connection: not HTTP, or
	// larger than the read buffer (the connection returned no error).
	unreadable bool
}

func (e *answerBroke) Error() string { return "the answer broke: " + e.err.Error() }
func (e *answerBroke) Unwrap() error { return e.err }

// began reports a failure after the answer's first byte (answerBroke).
func began(err error) bool {
	_, ok := errors.AsType[*answerBroke](err)
	return ok
}

// send writes c.up on a pooled connection of u and reads the answer's
// headers, leaving its body to stream: an error other than answerBroke
// means no byte of an answer came back, so the request may move to another
// worker (retryable). The first byte must come within lim's
// FirstByteTimeout of start, the time the caller took before (0: no
// limit); once bytes flow the connection's idle deadline, lim's
// StreamIdleTimeout, takes over (trackedConn). token marks the
// connection as the caller's until endConn, so that cut (from another
// goroutine, once stop is set) closes this connection and no other.
//
// A pooled connection that fails before any answer byte is most often one
// the worker closed while it idled (it restarted, or its own keep-alive
// timeout ran out): the request then goes again on another connection to
// the same worker, until one that was never used before fails too. So a
// worker's restart costs no request and no mark against its health.
func (c *upCall) send(u *upstream, token uint32, start time.Time, lim *Limits, stop *atomic.Uint32) error {
	var deadline time.Time
	if lim.FirstByteTimeout > 0 {
		deadline = start.Add(lim.FirstByteTimeout)
	}
	for {
		reused, err := c.sendOn(u, token, deadline, lim, stop)
		if err == nil || !reused || isTimeout(err) || began(err) || stop.Load() != 0 {
			return err
		}
	}
}

// sendOn is one try of send on one connection, due by deadline or up to
// an eighth of lim's FirstByteTimeout later; reused says the connection
// had carried a request before.
func (c *upCall) sendOn(u *upstream, token uint32, deadline time.Time, lim *Limits, stop *atomic.Uint32) (reused bool, err error) {
	h, tc, err := u.conns.acquire()
	if err != nil {
		return false, err
	}
	reused, tc.used = tc.used, true
	c.conn, c.connHandle, c.connOf, c.bodyDone = tc, h, u, false
	tc.owner.Store(token)
	c.upConn.Store(tc)
	if stop.Load() != 0 { // stopped before the connection was published
		c.endConn(token)
		return reused, errStopped
	}
	if err = tc.arm(deadline, lim.FirstByteTimeout/8, lim.StreamIdleTimeout); err == nil {
		bw := u.hc.AcquireWriter(tc)
		// A client's Connection: close is for its own connection, and so
		// is its protocol: an HTTP/1.0 client's request goes as HTTP/1.1,
		// so that the worker keeps the connection open and may chunk its
		// answer, as nginx (proxy_http_version 1.1), HAProxy and Go's
		// reverse proxy send every request. (It may be the request itself:
		// both are restored for fasthttp to read.)
		closing, older := c.up.Header.ConnectionClose(), !c.up.Header.IsHTTP11()
		var room [16]byte
		var proto []byte
		if older {
			proto = append(room[:0], c.up.Header.Protocol()...)
			c.up.Header.SetProtocolBytes(http11)
		}
		c.up.Header.ResetConnectionClose()
		tc.hold() // its last write leaves from the wait for the answer (awaitReadable)
		if err = c.up.Write(bw); err == nil {
			err = bw.Flush()
		}
		if closing {
			c.up.Header.SetConnectionClose()
		}
		if older {
			c.up.Header.SetProtocolBytes(proto)
		}
		u.hc.ReleaseWriter(bw)
	}
	switch {
	case err != nil:
	case !tc.beginWait() && tc.closedSeen():
		// The worker closed it since the pool lent it: the request (its
		// last write, held) goes again on another connection instead.
		tc.countClosedByWorker()
		err = fasthttp.ErrConnectionClosed
	default:
		// The request leaves from the wait, which does not read first: a
		// worker's close that came before the wait would leave it waiting
		// out the first-byte timeout, but for the watch (readAfter).
		tc.awaitReadable() // the first byte may be minutes away: wait for it holding no read buffer
		tc.endWait()
		c.br = u.hc.AcquireReader(tc)
		c.resp.StreamBody = true
		err = c.resp.ReadLimitBody(c.br, 0)
		if err != nil && tc.answered {
			err = &answerBroke{err: err, unreadable: tc.readErr == nil}
		}
	}
	if err != nil {
		c.endConn(token)
	}
	return reused, err
}

// endConn gives the connection back: to the pool when the answer was read
// to its end and nobody cut it, closed otherwise.
func (c *upCall) endConn(token uint32) {
	tc := c.conn
	if tc == nil {
		return
	}
	c.upConn.Store(nil)
	reuse := c.bodyDone && !c.resp.ConnectionClose() && c.resp.Header.ContentLength() != -2 &&
		!tc.pending() && tc.owner.CompareAndSwap(token, 0) // bytes past the answer: a worker out of step
	_ = c.resp.CloseBodyStream()
	if c.br != nil {
		c.connOf.hc.ReleaseReader(c.br)
		c.br = nil
	}
	c.connOf.conns.release(c.connHandle, reuse)
	c.conn, c.connHandle, c.connOf = nil, nil, nil
}

// cut closes the connection of the call marked with token, unless the
// call already gave it back. Closing the connection is how an engine
// learns to stop working on a request.
func (c *upCall) cut(token uint32) {
	if tc := c.upConn.Load(); tc != nil && tc.owner.CompareAndSwap(token, 0) {
		_ = tc.Conn.Close()
	}
}

// awaitStream waits for the worker's next bytes of a sent call's streamed
// answer. With none buffered it gives the connection reader's buffer back
// to the upstream's pool of readers while it waits, and takes one from
// there (the same or another) when bytes come: an open stream whose worker
// is between chunks holds no read buffer. The pool is the one requests to
// the worker take their readers from (send), so the buffers of waiting
// streams serve the streams that read and the requests that start: a pool
// of their own would gain a buffer for every stream opened while others
// wait, and keep it until two collections passed. fasthttp's body stream
// keeps reading through br, whose contents, not its address, move. A wait
// that fails (the idle deadline, a cut connection) is met again by the next
// read.
func (c *upCall) awaitStream() {
	br, tc := c.br, c.conn
	if br.Buffered() > 0 || tc.pending() {
		return
	}
	if tc.raw == nil { // not a socket: wait holding the buffer
		_, _ = br.Peek(1)
		return
	}
	hc := c.connOf.hc
	lent := c.shell
	if lent == nil {
		lent = new(bufio.Reader)
	}
	*lent, *br = *br, bufio.Reader{}
	hc.ReleaseReader(lent)
	tc.awaitReadable()
	r := hc.AcquireReader(tc) // reads from tc, with the pool's buffer or a new one
	*br, *r = *r, bufio.Reader{}
	c.shell = r
}

// dropReader gives the connection's reader back to the upstream's pool
// for good, its buffered bytes taken: the rest of the answer is read from
// the socket itself (chunkRelay), and fasthttp's body stream, which reads
// through the reader, is not read again.
func (c *upCall) dropReader() {
	if c.br != nil {
		c.connOf.hc.ReleaseReader(c.br)
		c.br = nil
	}
}

// errAnswerTooLarge is an answer that had to be read whole and was longer
// than limits.answer_buffer_bytes.
var errAnswerTooLarge = errors.New("answer larger than limits.answer_buffer_bytes")

// readAll reads the rest of a sent call's answer into dst, at most limit
// bytes of it (errAnswerTooLarge beyond: the rest is left unread).
func (c *upCall) readAll(dst []byte, limit int) ([]byte, error) {
	body := c.resp.BodyStream()
	if body == nil {
		c.bodyDone = true
		return dst, nil
	}
	if n := c.resp.Header.ContentLength(); n > limit {
		return dst, errAnswerTooLarge
	}
	for {
		if len(dst) == cap(dst) {
			dst = append(dst, 0)[:len(dst)]
		}
		n, err := body.Read(dst[len(dst):min(cap(dst), limit+1)])
		if dst = dst[:len(dst)+n]; len(dst) > limit {
			return dst, errAnswerTooLarge
		}
		if err == io.EOF {
			c.bodyDone = true
			return dst, nil
		}
		if err != nil {
			return dst, err
		}
	}
}

// trackedConn is an upstream connection listed in set while open, so a
// shutdown that runs out of time can cut it.
//
// Its deadlines are coarse: a deadline up to an eighth of its timeout later
// than asked serves, so one is set on the connection only when the one
// there is earlier than asked or later than that. A request's first read
// waits for the answer's first byte (arm); each later read must come within
// idle (stream_idle_timeout) of the one before. So a connection that
// carries request after request of short answers sets a deadline about
// every first_byte_timeout/8, not two or three per request, and a stream
// that keeps sending is never cut.
type trackedConn struct {
	net.Conn
	set    *xsync.MapOf[net.Conn, struct{}]
	idle   time.Duration // the current request's stream_idle_timeout (arm)
	rd, wd time.Time     // the read and write deadlines set on Conn
	reads  int           // reads of the current answer
	// Of the current answer (arm resets them): a byte of it came, and the
	// error a read of it returned.
	answered bool
	readErr  error
	// A wait for the answer's next bytes ran out the read deadline: the
	// deadline stays, and the read after the wait fails at it.
	waitLapsed bool
	owner      atomic.Uint32 // token of the exchange using it; 0: none, or cut
	used       bool          // it carried a request before (its holder alone reads it)
	// The watch for the worker's close (watchCloses, beginWait); set
	// before the connection is used.
	closes *hangup.Watcher[trackedConn]
	watch  hangup.Conn
	sock   syscall.RawConn // the socket watched (a TLS connection's too); nil: none
	// In the pool: connLent (or not pooled yet), connIdle or connDead
	// (pool, lend, workerClosed).
	pooled atomic.Uint32
	stats  *workerStats // its worker's (nil: not dialed by an upstream)
	closed atomic.Bool  // Close was called (stats.open counts it closed)
	sockIO
}

// The states of a kept-alive connection in its pool (trackedConn.pooled).
const (
	connLent uint32 = iota // lent to a request, or new
	connIdle               // in the pool, watched for its worker's close
	connDead               // closed in the pool: its worker closed it (workerClosed)
)

func newTrackedConn(c net.Conn, set *xsync.MapOf[net.Conn, struct{}]) *trackedConn {
	tc := &trackedConn{Conn: c, set: set}
	tc.init(c)
	tc.sock = tc.raw
	if t, ok := c.(*tls.Conn); ok {
		if sc, ok := t.NetConn().(syscall.Conn); ok {
			tc.sock, _ = sc.SyscallConn()
		}
	}
	// A request sent, its wait reads before it waits only once the watch
	// saw the worker close the connection (and finds the close). The wait's
	// work began before (beginWait), so a close seen after that check comes
	// with a wake-up that lands after the wait took the socket's readiness
	// (workerClosed).
	tc.readAfter = tc.closedSeen
	return tc
}

// coarse returns the deadline to set for want, or ok when cur, the one
// set, serves: it is no earlier than want and at most slack later. A zero
// want (no limit) is served only by no deadline.
func coarse(cur, want time.Time, slack time.Duration) (next time.Time, ok bool) {
	if want.IsZero() {
		return want, cur.IsZero()
	}
	if !cur.IsZero() && !cur.Before(want) && !cur.After(want.Add(slack)) {
		return cur, true
	}
	return want.Add(slack), false
}

// arm starts a request on the connection: its write and its answer's first
// byte are due by deadline (zero: no limit), or up to slack later (an
// eighth of the first-byte timeout), and each later read of its answer
// within idle of the one before (zero: no limit).
func (c *trackedConn) arm(deadline time.Time, slack, idle time.Duration) error {
	c.reads, c.waitLapsed, c.answered, c.readErr, c.idle = 0, false, false, nil, idle
	rd, rok := coarse(c.rd, deadline, slack)
	wd, wok := coarse(c.wd, deadline, slack)
	switch {
	case !rok && !wok && rd.Equal(wd):
		c.rd, c.wd = rd, wd
		return c.Conn.SetDeadline(rd)
	case !rok:
		c.rd = rd
		if err := c.Conn.SetReadDeadline(rd); err != nil {
			return err
		}
	}
	if !wok {
		c.wd = wd
		return c.Conn.SetWriteDeadline(wd)
	}
	return nil
}

// Read reads the answer: its first read under the first-byte deadline, each
// later one within idle.
func (c *trackedConn) Read(p []byte) (n int, err error) {
	if c.pending() {
		n, err = c.take(p)
	} else {
		c.armIdle()
		c.reads++
		n, err = c.read(p)
	}
	if n > 0 {
		c.answered = true
	}
	if err != nil {
		c.readErr = err
	}
	return n, err
}

func (c *trackedConn) Write(p []byte) (int, error) { return c.write(p) }

// armIdle sets the idle deadline of a read after an answer's first.
func (c *trackedConn) armIdle() {
	if c.reads > 0 && c.idle > 0 && !c.waitLapsed {
		if next, ok := coarse(c.rd, time.Now().Add(c.idle), c.idle/8); !ok {
			c.rd = next
			_ = c.Conn.SetReadDeadline(next)
		}
	}
}

// awaitReadable waits for the answer's next bytes under the read deadline
// a read would have, and reads them ahead (sockIO.await).
func (c *trackedConn) awaitReadable() {
	if c.pending() {
		return
	}
	c.armIdle()
	if c.await() {
		c.reads++
	} else if c.raw != nil {
		c.waitLapsed = true // or the connection closed, and the read fails as well
	}
}

// Close closes the connection and drops it from the set (again: the
// watch may close a pooled connection before fasthttp's pool does).
func (c *trackedConn) Close() error {
	c.dropHeld() // a request never sent
	c.set.Delete(c)
	if c.closes != nil {
		c.closes.Remove(c.watch)
	}
	if c.closed.CompareAndSwap(false, true) && c.stats != nil {
		c.stats.open.Add(-1)
	}
	return c.Conn.Close()
}

// watchCloses adds a new connection to w, the watch for workers' closes
// (one epoll_ctl call for the connection's life), so that a wait on it
// that would miss its worker's close learns of it (beginWait), and the
// pool lends no connection its worker closed while it idled
// (hostPool.acquire). A nil w watches nothing.
func (c *trackedConn) watchCloses(w *hangup.Watcher[trackedConn]) {
	if w == nil || c.sock == nil {
		return
	}
	_ = c.sock.Control(func(fd uintptr) { c.watch, _ = w.Add(int(fd)) })
	if c.watch.Gen() != 0 {
		c.closes = w
	}
}

// beginWait names a wait the work on the connection until endWait, so
// that the worker's close meanwhile wakes it (workerClosed): a wait that
// would not read before it waits (a relay's, once the socket is drained;
// one for an answer's first byte, begun as the request leaves) would miss
// a close that came before it began, which no readiness follows. False: a
// close would go unseen (not watched, or the worker closed already).
func (c *trackedConn) beginWait() bool {
	return c.closes != nil && c.closes.Begin(c.watch, c)
}

// closedSeen says the watch saw the worker close the connection (false
// when it is not watched). During a wait's work (beginWait returned true)
// a close seen after this call wakes the wait (workerClosed); one seen
// before must be met by a read.
func (c *trackedConn) closedSeen() bool { return c.closes != nil && c.closes.Closed(c.watch) }

// endWait ends the watch beginWait (or pool) began.
func (c *trackedConn) endWait() {
	if c.closes != nil {
		c.closes.End(c.watch, c)
	}
}

// pool marks the connection idle in its pool and watches it there, so that
// its worker's close closes it at once (workerClosed), as nginx's keepalive
// cache closes a connection its upstream closed: the socket does not sit in
// CLOSE_WAIT until the next request or fasthttp's idle sweep finds it.
// False: the worker closed it already.
func (c *trackedConn) pool() bool {
	if c.closes == nil {
		return true
	}
	c.pooled.Store(connIdle)
	if c.closes.Begin(c.watch, c) {
		return true
	}
	c.pooled.Store(connLent)
	return false
}

// lend takes the connection out of its pool's watch for a request: false
// when the watch closed it meanwhile (workerClosed).
func (c *trackedConn) lend() bool {
	c.endWait()
	return c.pooled.CompareAndSwap(connIdle, connLent) || c.pooled.Load() == connLent
}

// countClosedByWorker counts the connection among those its worker closed
// before a request went on it (workerStats.closedByWorker).
func (c *trackedConn) countClosedByWorker() {
	if c.stats != nil {
		c.stats.closedByWorker.Inc()
	}
}

// workerClosed is the close watch's call for a connection whose worker
// closed it (or reset it) while a wait was its work (beginWait): it shuts
// the connection's read side, which wakes the poller's wait as new bytes
// would (the close alone may not: a relay's last read may have taken it
// with the last bytes, or it came before the wait began, and no wake-up
// follows). The bytes still unread
// are read all the same; the next read after them finds the end. A
// connection its worker closed is of no more use, so a relay that ended
// meanwhile loses nothing either.
//
// A connection idle in its pool (trackedConn.pool) is closed instead, and
// counted closed by its worker: nothing waits on it, and lend finds it
// dead.
func workerClosed(c *trackedConn, _ uint32) {
	if c.pooled.CompareAndSwap(connIdle, connDead) {
		c.countClosedByWorker()
		_ = c.Close()
		return
	}
	_ = c.sock.Control(func(fd uintptr) { _ = syscall.Shutdown(int(fd), syscall.SHUT_RD) })
}
