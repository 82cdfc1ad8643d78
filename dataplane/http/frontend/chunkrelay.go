package frontend

import (
	"io"
	"net"
	"syscall"
)

// chunkRelay sends a worker's chunked answer (a stream of events) on to the
// client from inside one wait of the poller for the worker's socket
// (syscall.RawConn's Read): a step reads what came, decodes it (dechunker),
// frames it for the client and sends it straight from there. Go's poller
// forgets a socket's readiness when a wait begins, so a wait begins with a
// read, and a relay that waited afresh for each chunk made a read that
// found nothing for every chunk (two receives per chunk, nginx one);
// inside one wait the poller forgets nothing between its calls of the
// step, so after a read that did not fill its buffer (the socket is
// drained) the step asks for the next wake-up without reading again. Only
// the worker's close escapes that: the receive that takes its last bytes
// may take its close too, and no wake-up follows. nginx learns of it from
// epoll's EPOLLRDHUP, which Go's poller does not pass on; here the
// connection is watched for it in an epoll set of its own while a relay
// waits on it (trackedConn.beginWait, one epoll_ctl call for the
// connection's life), and a close seen there shuts the connection's read
// side, which wakes the wait (workerClosed). Without that watch the step
// reads until a read finds nothing. A client with no room left, the
// answer's end or a broken answer end the wait; what the client had no
// room for then leaves as any write does, waiting for room under the write
// timeout. An open stream that waits on its worker holds no buffer: the
// step borrows one for the bytes at hand only (as copyStream does), and
// the connection's read buffer goes back to its pool once the bytes that
// came with the answer's head are sent.
type chunkRelay struct {
	ex      *exchange
	cc      *clientConn // the client's connection
	framed  bool        // the client gets chunks; else the bare data (HTTP/1.0)
	d       dechunker
	bp      *[]byte               // the lent buffer behind out, if out is in one
	out     []byte                // bytes the client had no room for yet
	err     error                 // what the read met instead of the answer's end
	werr    error                 // what the client's write met
	ended   bool                  // the answer was read to its end
	past    bool                  // the worker sent bytes past its answer
	head    bool                  // the response head left
	watched bool                  // the worker's close is watched for (beginWait): a drained socket needs no second read
	stepFn  func(fd uintptr) bool // step, made once per exchange
}

// relayable says the streamed answer can be relayed by a chunkRelay to the
// client connection conn: chunked, from a worker's socket, to a client's
// (not TLS, which crypto/tls writes).
func (ex *exchange) relayable(conn net.Conn) (*clientConn, bool) {
	cc, ok := conn.(*clientConn)
	return cc, ok && cc.lazy && ex.resp.Header.ContentLength() == -1 && ex.tail == nil &&
		ex.br != nil && ex.conn != nil && ex.conn.raw != nil
}

// relayChunks relays the chunked answer to the client's connection w (cc,
// as taken over), framed in chunks when framed, and ends the exchange,
// unless the answer broke and its error event is still to be sent
// (handOver: copyStream sends it); headSent: the response head left.
func (ex *exchange) relayChunks(w net.Conn, cc *clientConn, framed bool) (complete, handOver, headSent bool, werr error) {
	r := &ex.relay
	*r = chunkRelay{ex: ex, cc: cc, framed: framed, stepFn: r.stepFn}
	tc := ex.conn
	r.watched = tc.beginWait()
	for r.err == nil && r.werr == nil && !r.ended {
		switch {
		case len(r.out) > 0:
			r.flush(w)
		case r.buffered():
			r.relayBuffered()
		default:
			ex.dropReader()
			tc.armIdle()
			if err := tc.raw.Read(r.stepFn); err != nil && r.err == nil {
				r.err = err
			}
		}
	}
	if r.err != nil && ex.broke(r.err) {
		// The answer broke: what came before it leaves, then its error event.
		if r.flush(w); r.werr == nil {
			headSent = r.head
			tc.endWait()
			r.reset()
			return false, true, headSent, nil
		}
	}
	complete, werr = r.end(w)
	return complete, false, true, werr
}

// reset forgets the relay's exchange and connection: the exchange goes
// back to its pool.
func (r *chunkRelay) reset() { *r = chunkRelay{stepFn: r.stepFn} }

// buffered says answer bytes already read wait to be relayed.
func (r *chunkRelay) buffered() bool {
	br := r.ex.br
	return br != nil && br.Buffered() > 0 || r.ex.conn.pending()
}

// relayBuffered relays answer bytes already read: those that came with
// the head (in the connection's reader), or read ahead (tc.pending).
func (r *chunkRelay) relayBuffered() {
	bp, lo, hi := lendForChunk(r.framed)
	buf := *bp
	var n int
	var err error
	if br := r.ex.br; br != nil && br.Buffered() > 0 {
		n, err = br.Read(buf[lo:hi])
	} else {
		n, err = r.ex.conn.take(buf[lo:hi])
	}
	if n == 0 {
		lentBufs.Put(bp)
		r.err = unexpectedEnd(err)
		return
	}
	r.relay(bp, lo, n)
}

// step is the relay's call between the poller's wake-ups for the worker's
// socket fd: it relays what came, and asks for the next wake-up (false)
// once a read finds nothing, or found the socket drained while the
// worker's close is watched for; true ends the wait.
func (r *chunkRelay) step(fd uintptr) bool {
	tc := r.ex.conn
	for {
		bp, lo, hi := lendForChunk(r.framed)
		n, errno := recvSome(fd, (*bp)[lo:hi])
		switch {
		case errno == syscall.EAGAIN:
			lentBufs.Put(bp)
			tc.armIdle()
			return false
		case errno != 0:
			lentBufs.Put(bp)
			r.err = opError("read", tc.Conn, errno)
			return true
		case n == 0:
			lentBufs.Put(bp)
			r.err = io.ErrUnexpectedEOF
			return true
		}
		if !r.relay(bp, lo, n) {
			return true
		}
		// Drained: whatever comes next wakes the poller, a close the
		// watch sees from now on too (workerClosed).
		if n < hi-lo && r.watched && !tc.closedSeen() {
			tc.armIdle()
			return false
		}
	}
}

// relay decodes the n answer bytes at buf[lo:] of the lent buffer bp,
// frames their data for the client and sends what the client has room
// for now. False: the relay stops (the answer ended or broke, the client
// is gone or has no room), and out holds what is left to send.
func (r *chunkRelay) relay(bp *[]byte, lo, n int) bool {
	buf := *bp
	m, used, err := r.d.decode(buf[lo : lo+n])
	r.ex.bytes += int64(m)
	if m > 0 && r.ex.inspects() {
		r.ex.inspect(buf[lo : lo+m])
	}
	switch {
	case err != nil:
		r.err = err
	case r.d.done():
		r.ended, r.past = true, used < n
	}
	out := r.ex.chunkOut(buf, lo, m, r.framed, r.ended, !r.head)
	r.head = true
	r.bp, r.out = bp, out
	if r.ended || r.err != nil {
		return false // the books close before the last bytes leave (end)
	}
	if len(out) > 0 {
		r.out, r.werr = r.cc.tryWrite(out)
	}
	if len(r.out) > 0 || r.werr != nil {
		return false
	}
	lentBufs.Put(bp)
	r.bp = nil
	return true
}

// flush sends the bytes the client had no room for, waiting for room
// under the write timeout.
func (r *chunkRelay) flush(w net.Conn) {
	if len(r.out) > 0 && r.werr == nil {
		r.ex.s.armWrite(w)
		_, r.werr = w.Write(r.out)
	}
	r.out = nil
	if r.bp != nil {
		lentBufs.Put(r.bp)
		r.bp = nil
	}
}

// end closes the books of the relayed answer (settleStream) and sends its
// last bytes, then ends the exchange. complete: the answer was sent to its
// end.
func (r *chunkRelay) end(w net.Conn) (complete bool, werr error) {
	ex := r.ex
	ex.conn.endWait()                // before the connection goes back to its pool (settle)
	ex.bodyDone = r.ended && !r.past // bytes past the answer: a worker out of step, whose connection closes
	ex.settleStream(r.werr)
	r.flush(w)
	complete, werr = r.ended && r.werr == nil, r.werr
	r.reset()
	ex.recycle()
	return complete, werr
}

// unexpectedEnd is what a read that returned no bytes met: an end of the
// connection before the answer's is io.ErrUnexpectedEOF.
func unexpectedEnd(err error) error {
	if err == nil || err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
