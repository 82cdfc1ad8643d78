package frontend

import (
	"errors"
	"net"
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
// Here that first read waits for the request and reads it ahead (readAhead),
// and the reads that follow take it from there: one system call fewer per
// request, whether or not it had already come.
type clientConn struct {
	net.Conn
	readAhead
}

func (c *clientConn) Read(p []byte) (int, error) {
	if c.pending() {
		return c.take(p)
	}
	// Only fasthttp's read of a request's first byte reads ahead; when its
	// wait fails, so does the read.
	if len(p) != 1 || !c.await() {
		return c.Conn.Read(p)
	}
	return c.take(p)
}

var errNotASocket = errors.New("the client connection is not a socket")

// SyscallConn is the socket's, for the hang-up watcher.
func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	if c.raw == nil {
		return nil, errNotASocket
	}
	return c.raw, nil
}
