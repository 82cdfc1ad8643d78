package frontend

import (
	"errors"
	"net"
	"sync"
	"syscall"
)

// clientListener hands fasthttp clientConns.
type clientListener struct{ net.Listener }

func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &clientConn{Conn: c}
	cc.init(c)
	return cc, nil
}

// clientConn is a client connection that reads a request's first bytes
// in one call. fasthttp, which holds no read buffer on an idle keep-alive
// connection (ReduceMemoryUsage), reads a request's first byte alone and
// then the rest: a read that finds nothing yet, the one byte, and the rest.
// Here that first read waits for the socket holding no buffer (a look that
// finds nothing), reads what came into a buffer lent for it, and hands the
// rest out to the reads that follow: one system call fewer per request.
type clientConn struct {
	net.Conn
	socketWait
	ahead  *[]byte // bytes read past what was asked; nil: none
	off, n int     // what is left of ahead: [off, n)
}

// aheadBufs lend the buffers requests are first read into: most requests
// fit whole; the rest of a larger one is read as asked.
var aheadBufs = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }}

func (c *clientConn) Read(p []byte) (int, error) {
	if c.ahead != nil {
		n := copy(p, (*c.ahead)[c.off:c.n])
		if c.off += n; c.off == c.n {
			aheadBufs.Put(c.ahead)
			c.ahead = nil
		}
		return n, nil
	}
	if len(p) != 1 || c.raw == nil { // only fasthttp's read of a request's first byte reads ahead
		return c.Conn.Read(p)
	}
	c.await()
	bp := aheadBufs.Get().(*[]byte)
	n, err := c.Conn.Read(*bp)
	if n == 0 {
		aheadBufs.Put(bp)
		return 0, err
	}
	p[0] = (*bp)[0]
	if n == 1 {
		aheadBufs.Put(bp)
	} else {
		c.ahead, c.off, c.n = bp, 1, n
	}
	return 1, nil
}

var errNotASocket = errors.New("the client connection is not a socket")

// SyscallConn is the socket's, for the hang-up watcher.
func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	if c.raw == nil {
		return nil, errNotASocket
	}
	return c.raw, nil
}
