package frontend

import (
	"context"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// A stream leaves fasthttp's serving goroutine: the client's connection
// is taken over (ctx.Hijack) and the exchange goes on in the fresh
// goroutine fasthttp starts for it, which writes the response itself: the
// head and chunk framing of a streamed answer, or a whole answer. An open
// stream so holds no fasthttp response writer and only the shallow stack
// of that goroutine, not the deep one of a serving loop that waits inside
// a handler; and a burst of new streams ties up fasthttp's serving
// goroutines only while their requests are read, not while their workers
// work. A request that asks for a stream is taken over once picked
// (runTaken), any other answer that turns out to stream once it does
// (sendStream). When the answer ends well on a keep-alive connection,
// fasthttp serves the connection's next requests again (giveBack).

// takeOver has fasthttp hand the client's connection to run, in a
// goroutine of its own, once the handler returns.
func (ex *exchange) takeOver(ctx *fasthttp.RequestCtx, run fasthttp.HijackHandler) {
	ex.ctx = ctx
	ex.s.takeovers.Add(1)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(run)
}

// moveOn sends the answer to ctx's request from a take-over of its
// connection, which it then gives back to the gate: the request was read
// by a generation that retired since (SetClientLimits), and the next one is
// read by the current one, under the client limits set last. A connection
// whose next request came already (pipelined) is closed after the answer,
// which says so.
func (s *Server) moveOn(ctx *fasthttp.RequestCtx) {
	s.takeovers.Add(1)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { s.sendTaken(ctx, c) })
}

// runTaken sends a stream request on, from the connection c taken over
// from fasthttp, sends its answer there, streamed or not, and gives the
// connection back.
func (ex *exchange) runTaken(c net.Conn) {
	growStack4K()
	ctx := ex.ctx
	if ex.run(ctx) { // respond left it to be sent from here
		ex.beginStream(c)
		return
	}
	ex.s.sendTaken(ctx, c)
}

// sendTaken sends the answer of an exchange that ended (it is back in its
// pool), an error maybe, in ctx.Response, on the client's connection c
// taken over from fasthttp, and gives the connection back.
func (s *Server) sendTaken(ctx *fasthttp.RequestCtx, c net.Conn) {
	keep := s.keepAfter(ctx, c)
	if !keep {
		closeAfter(&ctx.Response.Header)
	}
	s.markCORS(ctx)
	s.armWrite(c)
	_, err := ctx.Response.WriteTo(c)
	s.giveBack(ctx.Conn(), c, keep && err == nil)
}

// beginStream readies a streamed answer's response head, for the client's
// connection c taken over from fasthttp (the one through which fasthttp's
// reader still reads), and has sendStream send the answer from a goroutine
// of its own. It returns at once, and fasthttp lets go of the request
// context, which an open stream so does not hold. It is the take-over of
// an answer that turned out to stream (respond) as well.
func (ex *exchange) beginStream(c net.Conn) {
	s, ctx := ex.s, ex.ctx
	ex.ctx, ex.up = nil, nil // the client's request goes with its context
	keep := s.keepAfter(ctx, c)
	// A worker's answer of unknown length is chunked for an HTTP/1.1
	// client; an HTTP/1.0 one reads it until the connection closes.
	h := &ctx.Response.Header
	framed := false
	if ex.resp.Header.ContentLength() < 0 {
		framed = ctx.Request.Header.IsHTTP11()
		if framed {
			h.SetContentLength(-1)
		} else {
			h.Del(fasthttp.HeaderTransferEncoding)
		}
	}
	if !keep {
		closeAfter(h)
	}
	s.markCORS(ctx)
	ex.head = h.AppendBytes(ex.head[:0])
	go ex.sendStream(c, ctx.Conn(), keep, framed)
}

// sendStream sends the streamed answer on c, head first, ends the exchange
// and gives the connection (conn, as tracked) back; keep: it may serve the
// next request if the answer ends well.
func (ex *exchange) sendStream(c, conn net.Conn, keep, framed bool) {
	growStack4K()
	s := ex.s
	complete, werr := ex.copyStream(c, conn, framed) // ex is back in its pool
	s.giveBack(conn, c, keep && complete && werr == nil)
}

// keepAfter says whether the connection c taken over for ctx's request
// may serve the next one: an HTTP/1.1 client that did not ask to close,
// and sent nothing yet past this request (pipelined), while the server
// runs, on a connection that came through the gate (Serve) and has not
// carried limits.max_requests_per_connection requests.
func (s *Server) keepAfter(ctx *fasthttp.RequestCtx, c net.Conn) bool {
	cc, _ := ctx.Conn().(*clientConn)
	return cc != nil && cc.gate != nil && !cc.spent(s.policy.Load().MaxRequestsPerConnection) && !cc.pipelined(c) && s.keepsAlive(ctx)
}

// keepsAlive says the answer to ctx's request leaves its connection open
// for the next request: an HTTP/1.1 client that did not ask to close, an
// answer that does not close it, while the server runs.
func (s *Server) keepsAlive(ctx *fasthttp.RequestCtx) bool {
	return ctx.Request.Header.IsHTTP11() && !ctx.Request.Header.ConnectionClose() &&
		!ctx.Response.Header.ConnectionClose() && !s.closing.Load()
}

// closeAfter marks a response as the connection's last.
func closeAfter(h *fasthttp.ResponseHeader) {
	h.Del(fasthttp.HeaderConnection) // fasthttp's keep-alive for HTTP/1.0
	h.SetConnectionClose()
}

// armWrite bounds the next write to the client by limits.write_timeout, as
// fasthttp does for the responses it writes: a whole answer, or one batch
// of a stream's chunks, so that a stream is bounded by its client's pace,
// not by its length (nginx's send_timeout).
func (s *Server) armWrite(c net.Conn) {
	if d := s.current.Load().limits.WriteTimeout; d > 0 {
		_ = c.SetWriteDeadline(time.Now().Add(d))
	}
}

// giveBack ends the take-over of the connection conn (as tracked:
// trackConn; c is its hijacked self): it waits in the gate for its next
// request (keep), once fasthttp's goroutine that gave it up is done with
// it too (handedOff); or it is closed.
func (s *Server) giveBack(conn, c net.Conn, keep bool) {
	if keep {
		_ = c.SetWriteDeadline(time.Time{})
		if cc := conn.(*clientConn); cc.handedOff() {
			s.continueConn(cc)
		}
		return
	}
	s.closeConn(conn) // c's own
	s.takeovers.Add(-1)
}

// closeConn closes a tracked client connection and forgets it.
func (s *Server) closeConn(c net.Conn) {
	_ = c.Close()
	s.trackConn(c, fasthttp.StateClosed)
}

// Room a lent buffer keeps around a chunk of the answer for its framing:
// the size line before it (4 KiB is "1000\r\n"), its CRLF and the last
// chunk after it.
const (
	chunkHeadRoom = 8
	chunkTailRoom = len("\r\n0\r\n\r\n")
)

// copyStream copies the streamed answer, after the response head, to the
// client's connection w (conn, as tracked), framed in chunks when framed,
// and ends the exchange. A chunked answer from a worker's socket to a
// client's goes through a chunkRelay, and comes here only for the error
// event that ends it when it broke; other answers (of stated length, read
// to the close, to a TLS client) are copied here. Between chunks of a
// chunked answer it waits for the worker's next bytes holding no buffer
// (awaitStream; a chunked body's end is bytes still to come, so that wait
// always ends), and borrows a buffer only to move them: an open stream
// that waits on its worker holds neither a read nor a write buffer. Chunks
// that came together leave in one write (readyChunk), the head with the
// first and the last chunk with the end: a client behind on a fast stream
// costs a write per batch, not per token.
// Once the worker's answer ended, the exchange's books close (settle)
// before the last bytes leave, the first too when the whole answer came
// at once, so that a client that has them finds them closed; the exchange
// goes back to its pool once the bytes left.
// complete: the answer was sent to its end; werr: the client's write
// failed.
func (ex *exchange) copyStream(w, conn net.Conn, framed bool) (complete bool, werr error) {
	chunked := ex.resp.Header.ContentLength() == -1
	headSent := false
	if cc, ok := ex.relayable(conn); ok {
		var handOver bool
		if complete, handOver, headSent, werr = ex.relayChunks(w, cc, framed); !handOver {
			return complete, werr
		}
	}
	for ; ; headSent = true {
		if chunked && ex.tail == nil && ex.br != nil {
			ex.awaitStream()
		}
		bp, lo, hi := lendForChunk(framed)
		buf := *bp
		n, err := ex.readAnswer(buf[lo:hi])
		for err == nil && lo+n < hi && ex.readyChunk() {
			var m int
			m, err = ex.readAnswer(buf[lo+n : hi])
			n += m
		}
		if n > 0 && ex.inspects() {
			ex.inspect(buf[lo : lo+n])
		}
		out := ex.chunkOut(buf, lo, n, framed, err == io.EOF, !headSent)
		ended := err != nil
		if ended {
			ex.settleStream(nil)
		}
		if len(out) > 0 {
			ex.s.armWrite(w)
			_, werr = w.Write(out)
		}
		lentBufs.Put(bp)
		switch {
		case ended:
			ex.recycle()
			return err == io.EOF && werr == nil, werr
		case werr != nil:
			ex.settleStream(werr)
			ex.recycle()
			return false, werr
		}
	}
}

// lendForChunk lends a buffer for answer bytes on their way to the client,
// and where in it they go: with room around them for the chunk framing,
// when framed.
func lendForChunk(framed bool) (bp *[]byte, lo, hi int) {
	bp = lentBufs.Get().(*[]byte)
	lo, hi = 0, len(*bp)
	if framed {
		lo, hi = chunkHeadRoom, len(*bp)-chunkTailRoom
	}
	return bp, lo, hi
}

// chunkOut returns the bytes that carry the n answer bytes at buf[lo:] to
// the client: framed as a chunk in place when framed (with the last chunk
// when last), after the response head when withHead (copied behind it in
// ex.head).
func (ex *exchange) chunkOut(buf []byte, lo, n int, framed, last, withHead bool) []byte {
	out := buf[lo : lo+n]
	if framed {
		out = frameChunk(buf, lo, n, last)
	}
	if withHead {
		ex.head = append(ex.head, out...)
		out = ex.head
	}
	return out
}

// frameChunk frames the n answer bytes at buf[lo:] as an HTTP/1.1 chunk in
// place, using the room around them, and adds the last chunk when last.
func frameChunk(buf []byte, lo, n int, last bool) []byte {
	start, end := lo, lo
	if n > 0 {
		var size [8]byte
		line := append(strconv.AppendUint(size[:0], uint64(n), 16), '\r', '\n')
		start = lo - len(line)
		copy(buf[start:], line)
		end = lo + n
		end += copy(buf[end:], "\r\n")
	}
	if last {
		end += copy(buf[end:], "0\r\n\r\n")
	}
	return buf[start:end]
}

// settleStream closes the books of a streamed answer's exchange (settle);
// werr is the client write error, if any.
func (ex *exchange) settleStream(werr error) {
	if ex.readErr != nil {
		w := ex.res.Worker()
		ex.s.statsOf(w).failed(failCut)
		ex.s.reportAnswer(w, false)
	}
	switch {
	case ex.readErr != nil && isTimeout(ex.readErr):
		ex.settle(outcomeTimeout)
	case ex.readErr != nil:
		ex.settle(outcomeUpstreamError)
	case werr != nil:
		ex.settle(outcomeCancelled)
	default:
		ex.settle(outcomeOK)
	}
}

// continueConn ends the take-over of a connection given back: it waits in
// the gate it came through for its next request, which fasthttp then
// serves.
func (s *Server) continueConn(cc *clientConn) {
	cc.handoff.Store(0)
	cc.gate.giveBack(cc)
	s.takeovers.Add(-1)
}

// awaitTakeovers waits until no connection is taken over from fasthttp
// (fasthttp's Shutdown no longer counts them), or ctx ends.
func (s *Server) awaitTakeovers(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for s.takeovers.Load() != 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// growStack4K grows the calling goroutine's stack to 4 KiB at once. A
// take-over's goroutine, and a stream's, start on a smaller stack, and
// what they run (writing a request, reading an answer's head or chunks)
// needs 4 KiB: left to itself the stack grows
// deep in those calls, a copy of every frame below. Grown while the stack
// is shallow, it is one cheap copy (CockroachDB's growstack does the
// same).
//
//go:noinline
func growStack4K() {
	var frame [2 << 10]byte
	keepFrame(frame[:])
}

// keepFrame keeps a frame the compiler would drop.
//
//go:noinline
func keepFrame([]byte) {}
