package frontend

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/valyala/fasthttp"
)

// WebSocket sessions (RFC 6455): vLLM's realtime API (/v1/realtime) and
// any other an engine serves under /v1/, on its own routes or those of the
// routes key. The opening request is routed like any other (its model the
// query's model parameter, as OpenAI's realtime URL names it), holds its
// worker's reservation and its API key's slot for the whole session, and
// goes to the worker on a connection of its own, outside the pool. When
// the worker switches protocols (101), the router relays bytes both ways
// as they come, reading none of them, until either side closes its
// connection (the other is then closed) or neither sends for
// limits.stream_idle_timeout; any other answer goes to the client as an
// answer does (one of router.retry_statuses, or a 404 to a session that
// names no model, moves the session on first: refusalMoves). A session
// ends as a request does: its reservation released, counted, logged
// (status 101), and cut by a drain that runs out of time.

// tunnelBuffer is the size of each direction's buffer in a session.
const tunnelBuffer = 8 << 10

var websocketToken = []byte("websocket")

// isWebSocket reports a request that opens a WebSocket session: a GET that
// asks for its connection to be upgraded to websocket.
func isWebSocket(h *fasthttp.RequestHeader) bool {
	return h.IsGet() && h.ConnectionUpgrade() && bytes.EqualFold(h.Peek(fasthttp.HeaderUpgrade), websocketToken)
}

// runTunnel is a WebSocket session, on the client's connection c taken over
// from fasthttp: it opens the session on the reserved worker, relays it,
// and ends the exchange; or sends the answer of a worker that did not
// switch, or the error of none that answered.
func (ex *exchange) runTunnel(c net.Conn) {
	s, ctx := ex.s, ex.ctx
	up, upIn := ex.openTunnel(ctx)
	if up == nil {
		s.sendTaken(ctx, c)
		return
	}
	ex.relayTunnel(ctx, c, up, upIn)
}

// openTunnel sends the session's opening request to the reserved worker,
// moving it to another on a failure before an answer (moveAfter) or on an
// answer of router.retry_statuses (refusalMoves), and reads
// the answer's head: the worker's connection, and the reader the session's
// first bytes may already be in, once it switched protocols (the head for
// the client then in ctx.Response). nil: it answered otherwise, or none
// did, and the exchange ended with the client's answer in ctx.Response.
func (ex *exchange) openTunnel(ctx *fasthttp.RequestCtx) (net.Conn, *bufio.Reader) {
	s := ex.s
	upgrade := append([]byte(nil), ctx.Request.Header.Peek(fasthttp.HeaderUpgrade)...)
	for {
		w := ex.res.Worker()
		u := s.upstreamOf(w)
		ex.res.Dispatched()
		start := time.Now()
		ex.sent = start.Sub(ex.start)
		up, err := u.connect()
		var upIn *bufio.Reader
		if err == nil {
			if upIn, err = ex.handshake(ctx, u, w, up, upgrade, start); err != nil {
				_ = up.Close()
			}
		}
		if err != nil {
			if !ex.moveAfter(ctx, u, w, err) {
				return nil, nil
			}
			continue
		}
		ex.headCame(u, w, start)
		status := ex.resp.StatusCode()
		if status != fasthttp.StatusSwitchingProtocols {
			_ = up.Close()
		}
		if ex.refusalMoves(w, status) {
			continue
		}
		s.sel.Answered(&ex.req, &ex.res)
		ex.copyHeaders(ctx, u)
		if status != fasthttp.StatusSwitchingProtocols {
			ctx.Response.SetBody(ex.resp.Body())
			ex.bytes = int64(len(ctx.Response.Body()))
			ex.finish(outcomeOK)
			return nil, nil
		}
		// The switch's own hop-by-hop headers, which copyHeaders dropped.
		h := &ctx.Response.Header
		h.Set(fasthttp.HeaderConnection, "Upgrade")
		h.SetBytesV(fasthttp.HeaderUpgrade, peekFold(&ex.resp.Header, fasthttp.HeaderUpgrade))
		return up, upIn
	}
}

// refusalMoves moves a session whose worker w answered status, no switch,
// to another worker: as any request moves on an answer of
// router.retry_statuses (movesOn), within router.retries and the retry
// budget; or, for a session that names no model, on a 404 (that engine
// serves no WebSocket on the path: another model's, or one without the
// realtime API), to a worker not tried yet, up to dataplane.MaxAttempts.
// False: the answer is the client's.
func (ex *exchange) refusalMoves(w *dataplane.Worker, status int) bool {
	switch {
	case status == fasthttp.StatusSwitchingProtocols:
		return false
	case status == fasthttp.StatusNotFound && len(ex.req.Model) == 0 && ex.req.WorkerID == 0 && ex.req.Attempts() < dataplane.MaxAttempts-1:
		// no model named: a worker not tried yet may serve the path
	case ex.movesOn(w) != moveStatus || !ex.mayRetry():
		return false
	}
	if ex.s.sel.Retry(&ex.req, &ex.res) != nil {
		return false
	}
	ex.s.metrics.retries.Inc()
	ex.traceMove(w, "status", status)
	return true
}

// handshake sends the session's opening request on up, a new connection
// to worker w of upstream u, asking for the client's upgrade, and reads
// the answer's head (and the body of an answer that is no switch) within
// limits.first_byte_timeout of start. An error after the answer's first
// byte is an answerBroke: the worker got the request.
func (ex *exchange) handshake(ctx *fasthttp.RequestCtx, u *upstream, w *dataplane.Worker, up net.Conn, upgrade []byte, start time.Time) (*bufio.Reader, error) {
	if d := ex.pol.FirstByteTimeout; d > 0 {
		_ = up.SetDeadline(start.Add(d))
	}
	ex.prepare(ctx, u, w)
	h := &ctx.Request.Header
	h.Set(fasthttp.HeaderConnection, "Upgrade")
	h.SetBytesV(fasthttp.HeaderUpgrade, upgrade)
	bw := bufio.NewWriterSize(up, tunnelBuffer)
	err := ctx.Request.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return nil, err
	}
	upIn := bufio.NewReaderSize(up, tunnelBuffer)
	if _, err := upIn.Peek(1); err != nil {
		return nil, err
	}
	if err := ex.resp.ReadLimitBody(upIn, ex.pol.AnswerBufferBytes); err != nil {
		return nil, &answerBroke{err: err}
	}
	_ = up.SetDeadline(time.Time{})
	return upIn, nil
}

// peekFold returns the value of the header named name, whatever the case
// of its name (a worker answer's are not normalized: upCall.prepare).
func peekFold(h *fasthttp.ResponseHeader, name string) []byte {
	for k, v := range h.All() {
		if bytes.EqualFold(k, []byte(name)) {
			return v
		}
	}
	return nil
}

// relayTunnel sends the worker's switch (its head in ctx.Response, and the
// session's first bytes when they came with it) to the client, relays the
// session both ways between the client's connection c, taken over from
// fasthttp, and the worker's up (read through upIn) until it ends, closes
// both and ends the exchange.
func (ex *exchange) relayTunnel(ctx *fasthttp.RequestCtx, c, up net.Conn, upIn *bufio.Reader) {
	s := ex.s
	ex.unwatch() // the relay reads the client's connection: its close ends the session
	conn := ctx.Conn()
	// Bytes for the client go to its socket itself, beside the relay's reads
	// through c: a clientConn's reads and writes share its read-ahead.
	toClient := c
	if cc, ok := conn.(*clientConn); ok {
		toClient = cc.Conn
	}
	_ = c.SetReadDeadline(time.Time{}) // the request's (read_timeout): the session's reads set their own
	st := s.statsOf(ex.res.Worker())
	s.upConns.Store(up, struct{}{})
	st.open.Add(1)
	s.tunnels.Add(1)
	t := tunnel{idle: ex.pol.StreamIdleTimeout}
	t.last.Store(time.Now().UnixNano())
	opening := ctx.Response.Header.AppendBytes(nil)
	if n := upIn.Buffered(); n > 0 {
		b, _ := upIn.Peek(n)
		opening = append(opening, b...)
		_, _ = upIn.Discard(n)
	}
	s.armWrite(toClient)
	o := outcomeCancelled
	if _, err := toClient.Write(opening); err == nil {
		// The direction that ends first closes both connections, which
		// ends the other, and says how the session ended.
		var first tunnelEnd
		end := func(e tunnelEnd) {
			t.once.Do(func() {
				first = e
				_ = up.Close()
				s.closeConn(conn)
			})
		}
		done := make(chan struct{})
		go func() {
			end(t.copy(up, c, c, t.armIdle, false))
			close(done)
		}()
		fromWorker := t.copy(toClient, upIn, up, s.armWrite, true)
		end(fromWorker)
		<-done
		ex.bytes = int64(len(opening)) + fromWorker.n
		o = sessionOutcome(first, fromWorker)
	}
	s.upConns.Delete(up)
	st.open.Add(-1)
	s.tunnels.Add(-1)
	_ = up.Close()
	if o == outcomeUpstreamError {
		st.failed(failCut)
		s.reportAnswer(ex.res.Worker(), false)
	}
	ex.finish(o)
	s.giveBack(conn, c, false)
}

// A tunnel is the state of one session's relay: both directions' idle
// bound and the close of both connections, once, by the first that ends.
type tunnel struct {
	idle time.Duration // limits.stream_idle_timeout (0: none)
	last atomic.Int64  // when bytes last came either way (Unix ns)
	once sync.Once
}

// tunnelEnd is how one direction of a session ended: the bytes it passed,
// and the read or write error that stopped it.
type tunnelEnd struct {
	n          int64
	read       error
	write      error
	fromWorker bool // the direction from the worker to the client
}

// copy passes what src (read from the connection from) sends to dst,
// each write bounded by arm, until a read or write fails; a read waits up
// to the idle bound past the last bytes either way.
func (t *tunnel) copy(dst net.Conn, src io.Reader, from net.Conn, arm func(net.Conn), fromWorker bool) tunnelEnd {
	e := tunnelEnd{fromWorker: fromWorker}
	buf := make([]byte, tunnelBuffer)
	for {
		if t.idle > 0 {
			_ = from.SetReadDeadline(time.Now().Add(t.idle))
		}
		n, err := src.Read(buf)
		if n > 0 {
			t.last.Store(time.Now().UnixNano())
			arm(dst)
			if _, e.write = dst.Write(buf[:n]); e.write != nil {
				return e
			}
			e.n += int64(n)
		}
		if err != nil {
			if isTimeout(err) && time.Since(time.Unix(0, t.last.Load())) < t.idle {
				continue // the other way is busy
			}
			e.read = err
			return e
		}
	}
}

// armIdle bounds a write to the worker by the idle bound.
func (t *tunnel) armIdle(c net.Conn) {
	if t.idle > 0 {
		_ = c.SetWriteDeadline(time.Now().Add(t.idle))
	}
}

// sessionOutcome is how a session ended: timed out when the direction
// that ended first (first) waited the idle bound for bytes from either
// way; an upstream error when the worker's connection failed under the
// relay's reads (fromWorker's: not closed, which ends a session, nor
// closed by the relay once the other way ended); cancelled when the client
// went away under a write of the worker's bytes; else well. A write to the
// worker that fails is none of these: a client's answer to the worker's
// close (WebSocket's closing handshake) may find the worker gone, as it
// should.
func sessionOutcome(first, fromWorker tunnelEnd) outcome {
	switch {
	case isTimeout(first.read):
		return outcomeTimeout
	case fromWorker.read != nil && !errors.Is(fromWorker.read, io.EOF) && !errors.Is(fromWorker.read, net.ErrClosed):
		return outcomeUpstreamError
	case first.fromWorker && first.write != nil:
		return outcomeCancelled
	}
	return outcomeOK
}
