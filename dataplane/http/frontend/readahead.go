package frontend

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// readAhead reads a socket's next bytes once they come, into a buffer lent
// only while they wait to be taken: a connection waiting for bytes holds no
// buffer. Its wait makes the system calls a plain read would (a read that
// finds nothing yet, then the one after the poller's wake-up), and the
// bytes are then taken without another.
type readAhead struct {
	conn   net.Conn              // for the addresses of an error
	raw    syscall.RawConn       // nil: not a socket, await reads nothing
	fill   func(fd uintptr) bool // readOnce, made once
	buf    *[]byte               // bytes read ahead, [off, n); nil: none
	off, n int
	err    error // what the read ahead met instead of bytes, for take
}

// lentBufs are 4 KiB buffers lent only while bytes are at hand: read ahead
// (most requests and answer heads fit whole; the rest is read as asked),
// or a chunk of a streamed answer on its way to the client.
var lentBufs = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}

func (r *readAhead) init(c net.Conn) {
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			r.conn, r.raw, r.fill = c, raw, r.readOnce
		}
	}
}

// await waits, under the socket's read deadline, until it has bytes, its
// end or an error, and reads them ahead. False: it read nothing, because
// the connection is not a socket, or the wait failed (the deadline passed,
// the connection was closed) as a read would now.
func (r *readAhead) await() bool { return r.raw != nil && r.raw.Read(r.fill) == nil }

// readOnce is await's read, called before each wait for the socket.
func (r *readAhead) readOnce(fd uintptr) bool {
	bp := lentBufs.Get().(*[]byte)
	for {
		n, err := unix.Read(int(fd), *bp)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			lentBufs.Put(bp)
			return false
		case n > 0:
			r.buf, r.off, r.n = bp, 0, n
			return true
		}
		lentBufs.Put(bp)
		r.err = io.EOF
		if err != nil { // as the net package reports a failed read
			r.err = &net.OpError{Op: "read", Net: r.conn.LocalAddr().Network(), Source: r.conn.LocalAddr(),
				Addr: r.conn.RemoteAddr(), Err: os.NewSyscallError("read", err)}
		}
		return true
	}
}

// pending says bytes (or an end) read ahead wait to be taken.
func (r *readAhead) pending() bool { return r.buf != nil || r.err != nil }

// take moves bytes read ahead into p, or returns what the read met.
func (r *readAhead) take(p []byte) (int, error) {
	if r.buf == nil {
		err := r.err
		r.err = nil
		return 0, err
	}
	n := copy(p, (*r.buf)[r.off:r.n])
	if r.off += n; r.off == r.n {
		lentBufs.Put(r.buf)
		r.buf = nil
	}
	return n, nil
}
