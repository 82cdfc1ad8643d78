package frontend

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fastroute/fastroute/internal/rawsock"
)

// sockIO reads a socket's next bytes once they come, into a buffer lent
// only while they wait to be taken: a connection waiting for bytes holds no
// buffer. Its wait makes the system calls a plain read would (a read that
// finds nothing yet, then the one after the poller's wake-up), or only the
// second when it sends a held write first (hold), and the bytes are then
// taken without another. It also writes to the socket (write). Both make
// raw system calls (rawsock.Read, rawsock.Write), and may keep deadlines off the
// socket until a call has to wait (deferDeadlines).
type sockIO struct {
	conn   net.Conn              // for the addresses of an error; written to as is when raw is nil
	raw    syscall.RawConn       // nil: not a socket, await reads nothing
	fill   func(fd uintptr) bool // readOnce, made once
	buf    *[]byte               // bytes read ahead, [off, n); nil: none
	off, n int
	into   []byte                // where read reads (readOnce), instead of a lent buffer
	err    error                 // what the read ahead met instead of bytes, for take
	drain  func(fd uintptr) bool // writeOnce, made once
	out    []byte                // what is left to write
	werr   error                 // what the write met
	noWait bool                  // the write does not wait for room (tryWrite)
	// A held write (hold): its bytes, in a lent buffer sliced to them,
	// leave from the next wait, which then begins without a read, or
	// before the next write (flushHeld too), or on a client connection's
	// Close (sendHeldAtClose). Atomic: a connection may be closed from
	// another goroutine.
	holding bool
	held    atomic.Pointer[[]byte]
	send    func(fd uintptr) bool // sendHeld, made once
	// Says, once a held write left, whether the wait must read before it
	// waits: the peer may have sent or closed before the wait began, which
	// the poller forgot (hold); nil: never.
	readAfter func() bool
	// Deadlines, when lazy (deferDeadlines): the ones asked and the ones
	// on the socket, in Unix nanoseconds (0: none).
	lazy                       bool
	rdAsk, rdSet, wdAsk, wdSet int64
}

// lentBufs are 4 KiB buffers lent only while bytes are at hand: read ahead
// (most requests and answer heads fit whole; the rest is read as asked),
// or a chunk of a streamed answer on its way to the client.
var lentBufs = sync.Pool{New: func() any { b := make([]byte, lentSize); return &b }}

const lentSize = 4 << 10

func (r *sockIO) init(c net.Conn) {
	r.conn = c
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			r.raw, r.fill, r.drain, r.send = raw, r.readOnce, r.writeOnce, r.sendHeld
		}
	}
}

// await waits, under the socket's read deadline, until it has bytes, its
// end or an error, and reads them ahead. False: it read nothing, because
// the connection is not a socket, or the wait failed (the deadline passed,
// the connection was closed) as a read would now.
func (r *sockIO) await() bool {
	if r.raw == nil {
		return false
	}
	if r.expired(r.rdSet, r.rdAsk) {
		r.syncReadDeadline()
	}
	return r.wait() == nil
}

// wait is a read through the poller (readOnce between waits). A held
// write leaves first, from inside it (sendHeld).
func (r *sockIO) wait() error {
	r.holding = false
	if r.held.Load() == nil {
		return r.raw.Read(r.fill)
	}
	err := r.raw.Read(r.send)
	bp := r.held.Swap(nil)
	switch {
	case bp == nil:
		return err
	case err != nil: // the wait failed before the bytes left
		putLent(bp)
		return err
	}
	// No room for all of them: the rest is written as any write is, and
	// the wait is a plain one.
	if err := r.writeHeld(bp); err != nil {
		r.err = err
		return nil
	}
	return r.raw.Read(r.fill)
}

// writeHeld writes held bytes, waiting for room.
func (r *sockIO) writeHeld(bp *[]byte) error {
	_, err := r.writeNow(*bp)
	putLent(bp)
	return err
}

// lendFor lends a buffer for n bytes, at most heldMax: a lent buffer, or
// past its size one of heldBufs.
func lendFor(n int) *[]byte {
	if n > lentSize {
		return heldBufs.Get().(*[]byte)
	}
	return lentBufs.Get().(*[]byte)
}

// putLent gives back a buffer of lentBufs or heldBufs, sliced to the bytes
// it held.
func putLent(bp *[]byte) {
	*bp = (*bp)[:cap(*bp)]
	if cap(*bp) > lentSize {
		heldBufs.Put(bp)
		return
	}
	lentBufs.Put(bp)
}

// heldMax is the largest write held (hold): a request or answer that
// leaves in one write of the 32 KiB write buffers.
const heldMax = 32 << 10

// heldBufs are the buffers of held writes larger than a lent buffer.
var heldBufs = sync.Pool{New: func() any { b := make([]byte, heldMax); return &b }}

// hold has the next write of at most heldMax bytes (the last of a request to
// a worker, of an answer to a client) wait for the next wait for bytes,
// which sends it and waits for the answer (or the client's next request) in
// one pass of the poller. The poller forgets whatever readiness it saw
// before a wait begins, so a plain wait starts with a read, which finds
// nothing when the bytes awaited answer what was just sent (a receive that
// finds nothing on most requests, as Go's poller has it). Sent from inside
// the wait, after the poller forgot, a worker's answer cannot have come
// before, and no read is made before the poller says it came (nginx's order:
// send, then wait for the event); the worker's close can, and the wait reads
// once the watch saw it (readAfter: trackedConn.closedSeen). A client's next
// request can come before its answer leaves too (HTTP/1.1 pipelining), so a
// client connection's wait always reads once the answer left (readAfter:
// always): without that read, a request sent while the one before was served
// waited unread for the idle timeout, and was lost with its connection. Held bytes leave before any later write
// too, and on Close; bytes read ahead and not yet taken (they need no wait)
// send the write at once. Held bytes are copied into a buffer lent until
// they leave (a second pool past 4 KiB): on 16 KB prompts that cost less
// than the read it saves (1.6% less CPU per request, p99 lower in 5
// interleaved rounds of 5), where holding only the end of a write split it
// in two sends, 11% more CPU. A larger write leaves whole at once.
func (r *sockIO) hold() { r.holding = r.raw != nil }

// sendHeld is wait's call between waits while a write is held: it sends
// the held bytes and asks for a wait without reading (false; it reads
// first when readAfter says so), then reads (readOnce). True while held
// bytes remain (no room for all of them), or when the send failed (the
// error is what the read ahead met).
func (r *sockIO) sendHeld(fd uintptr) bool {
	bp := r.held.Swap(nil)
	if bp == nil {
		return r.readOnce(fd)
	}
	switch rest, errno := sendAll(fd, *bp); errno {
	case 0:
		putLent(bp)
		if r.readAfter != nil && r.readAfter() {
			return r.readOnce(fd)
		}
		r.syncReadDeadline()
		return false
	case syscall.EAGAIN:
		*bp = (*bp)[:copy(*bp, rest)]
		r.held.Store(bp)
	default:
		putLent(bp)
		r.err = opError("write", r.conn, errno)
	}
	return true
}

// sendAll sends p until it is all sent (0), the socket has no room
// (EAGAIN) or the send fails, and returns what is left.
func sendAll(fd uintptr, p []byte) ([]byte, syscall.Errno) {
	for len(p) > 0 {
		n, errno := rawsock.Write(fd, p)
		switch errno {
		case 0:
			p = p[n:]
		case syscall.EINTR:
		default:
			return p, errno
		}
	}
	return p, 0
}

// always is a readAfter for a peer that may always have sent.
func always() bool { return true }

// recvSome reads what the socket fd holds into p, up to its length, again
// when a signal cut the call short.
func recvSome(fd uintptr, p []byte) (int, syscall.Errno) {
	n, errno := rawsock.Read(fd, p)
	for errno == syscall.EINTR {
		n, errno = rawsock.Read(fd, p)
	}
	return n, errno
}

// flushHeld sends a held write now, waiting for room.
func (r *sockIO) flushHeld() error {
	r.holding = false
	if bp := r.held.Swap(nil); bp != nil {
		return r.writeHeld(bp)
	}
	return nil
}

// sendHeldAtClose sends a held write before the socket closes, from
// whichever goroutine closes it: as much as the socket takes at once (a
// write that would wait for room is given up: the connection is going).
func (r *sockIO) sendHeldAtClose() {
	bp := r.held.Swap(nil)
	if bp == nil {
		return
	}
	_ = r.raw.Write(func(fd uintptr) bool {
		_, _ = sendAll(fd, *bp)
		return true
	})
	putLent(bp)
}

// dropHeld gives a held write's buffer back unsent.
func (r *sockIO) dropHeld() {
	if bp := r.held.Swap(nil); bp != nil {
		putLent(bp)
	}
}

// read reads into p as a net.Conn's Read does, waiting for bytes through
// the poller under the read deadline, with raw calls: for what a read
// ahead did not hold (a request or answer larger than its buffer).
func (r *sockIO) read(p []byte) (int, error) {
	if r.raw == nil || len(p) == 0 {
		return r.conn.Read(p)
	}
	if r.expired(r.rdSet, r.rdAsk) {
		r.syncReadDeadline()
	}
	r.into, r.n = p, 0 // n: what this read read, not what one before it did
	err := r.wait()
	r.into = nil
	if err != nil {
		return 0, err
	}
	n := r.n
	r.n = 0
	if n == 0 {
		err, r.err = r.err, nil
	}
	return n, err
}

// readOnce is the read of await, or of read, called before each wait for
// the socket: await's lands in a lent buffer, read's in its own.
func (r *sockIO) readOnce(fd uintptr) bool {
	var bp *[]byte
	dst := r.into
	if dst == nil {
		bp = lentBufs.Get().(*[]byte)
		dst = *bp
	}
	n, errno := recvSome(fd, dst)
	if errno == 0 && n > 0 {
		r.buf, r.off, r.n = bp, 0, n
		return true
	}
	if bp != nil {
		lentBufs.Put(bp)
	}
	switch errno {
	case syscall.EAGAIN:
		r.syncReadDeadline()
		return false
	case 0:
		r.err = io.EOF
	default:
		r.err = opError("read", r.conn, errno)
	}
	return true
}

// pending says bytes (or an end) read ahead wait to be taken.
func (r *sockIO) pending() bool { return r.buf != nil || r.err != nil }

// take moves bytes read ahead into p, or returns what the read met.
func (r *sockIO) take(p []byte) (int, error) {
	if r.buf == nil {
		err := r.err
		r.err = nil
		return 0, err
	}
	n := copy(p, (*r.buf)[r.off:r.n])
	if r.off += n; r.off == r.n {
		lentBufs.Put(r.buf)
		r.buf, r.off, r.n = nil, 0, 0
	}
	return n, nil
}

// write writes p whole, waiting for room through the poller under the
// socket's write deadline, or returns the error that stopped it.
func (r *sockIO) write(p []byte) (int, error) {
	if r.raw == nil {
		return r.conn.Write(p)
	}
	if bp := r.held.Swap(nil); bp != nil { // it goes first
		if err := r.writeHeld(bp); err != nil {
			return 0, err
		}
	}
	if r.holding && len(p) <= heldMax && !r.pending() {
		r.holding = false
		bp := lendFor(len(p))
		*bp = (*bp)[:copy(*bp, p)]
		r.held.Store(bp)
		return len(p), nil
	}
	return r.writeNow(p)
}

// writeNow is write without holding: p leaves now.
func (r *sockIO) writeNow(p []byte) (int, error) {
	if r.expired(r.wdSet, r.wdAsk) {
		r.syncWriteDeadline()
	}
	r.out, r.werr = p, nil
	err := r.raw.Write(r.drain)
	n := len(p) - len(r.out)
	r.out = nil
	if err == nil {
		err, r.werr = r.werr, nil
	}
	return n, err
}

// tryWrite sends what of p the socket has room for now, without waiting
// for more, and returns the rest: all of p while a held write waits to
// leave first. A deadline on the socket that passed (put there for an
// earlier wait) is taken off: this write makes no wait, and the next
// write that does puts the one it asks.
func (r *sockIO) tryWrite(p []byte) ([]byte, error) {
	if r.held.Load() != nil {
		return p, nil
	}
	if r.wdSet != 0 && r.wdSet <= time.Now().UnixNano() {
		r.wdSet = 0
		_ = r.conn.SetWriteDeadline(time.Time{})
	}
	r.out, r.werr, r.noWait = p, nil, true
	err := r.raw.Write(r.drain)
	rest := r.out
	r.out, r.noWait = nil, false
	if err == nil {
		err, r.werr = r.werr, nil
	}
	return rest, err
}

// writeOnce is write's call between waits for room: false asks for one
// (unless the write may not wait: tryWrite).
func (r *sockIO) writeOnce(fd uintptr) bool {
	var errno syscall.Errno
	switch r.out, errno = sendAll(fd, r.out); errno {
	case 0:
	case syscall.EAGAIN:
		if r.noWait {
			return true
		}
		r.syncWriteDeadline()
		return false
	default:
		r.werr = opError("write", r.conn, errno)
	}
	return true
}

// deferDeadlines makes the socket's deadlines lazy: a deadline asked
// (askRead, askWrite) is put on the socket only before a wait for it (a
// read that found nothing, a write that found no room), and coarse: only
// when the one there is earlier than asked, or later by more than an
// eighth of the time left to it. Whoever asks must be the one that then
// reads or writes: a lazy deadline does not cut a wait under way. So a
// connection whose requests come and go without waiting sets no deadline
// for them.
func (r *sockIO) deferDeadlines() { r.lazy = r.raw != nil }

func (r *sockIO) askRead(t time.Time) { r.rdAsk = unixNanos(t) }

func (r *sockIO) askWrite(t time.Time) { r.wdAsk = unixNanos(t) }

// syncReadDeadline puts the read deadline asked on a lazy socket, or one
// up to an eighth of its time later (coarse), unless the one there serves.
func (r *sockIO) syncReadDeadline() {
	if set, ok := syncedDeadline(r.lazy, &r.rdSet, r.rdAsk); !ok {
		_ = r.conn.SetReadDeadline(set)
	}
}

// syncWriteDeadline does for the write deadline what syncReadDeadline does
// for the read deadline.
func (r *sockIO) syncWriteDeadline() {
	if set, ok := syncedDeadline(r.lazy, &r.wdSet, r.wdAsk); !ok {
		_ = r.conn.SetWriteDeadline(set)
	}
}

// expired says a lazy socket's deadline set, not the one asked, has
// passed: the poller would fail a read or write under it before trying.
func (r *sockIO) expired(set, ask int64) bool {
	return r.lazy && set != 0 && set != ask && set <= time.Now().UnixNano()
}

// syncedDeadline returns the deadline to set for ask, noting it in *cur,
// or ok when the one set (*cur) serves.
func syncedDeadline(lazy bool, cur *int64, ask int64) (set time.Time, ok bool) {
	if !lazy || *cur == ask {
		return set, true
	}
	want := fromUnixNanos(ask)
	set, ok = coarse(fromUnixNanos(*cur), want, time.Until(want)/8)
	if !ok {
		*cur = unixNanos(set)
	}
	return set, ok
}

// unixNanos is t in Unix nanoseconds, 0 for the zero time (no deadline).
func unixNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNanos(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// opError reports a failed call on conn as the net package does.
func opError(op string, conn net.Conn, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: conn.LocalAddr().Network(), Source: conn.LocalAddr(),
		Addr: conn.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}
