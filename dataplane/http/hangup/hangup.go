// Package hangup tells when a client closes its connection while the router
// still works on its request (waits on a worker's answer): the connection's
// socket is watched for the peer's close (EPOLLRDHUP) in an epoll set of its
// own, beside Go's poller, so nothing is read from it and nothing it sent is
// lost. nginx reacts the same way to a client that closes early (its 499).
//
// A connection is added to the set once, when it opens (one epoll_ctl
// call); naming the request it works on (Begin, End) costs two atomic
// stores and no system call. One goroutine waits for every connection's
// events. The front end watches its connections to workers the same way,
// in a Watcher of their own, for the worker's close: Closed tells a wait
// that would not read first (a relayed stream's, a request's for its
// answer) that it must read once more, and the pool not to lend the
// connection; a connection idle in the pool is named its own work while
// it idles, and its worker's close closes it at once.
package hangup

import (
	"errors"
	"net"
	"syscall"
)

// Conn is a watched connection: its descriptor and generation (the
// descriptor of a closed connection is reused by a later one). The zero
// Conn is not watched.
type Conn struct {
	fd  int32
	gen uint32
}

// Gen is the connection's generation, unique among open connections; 0
// for one not watched.
func (c Conn) Gen() uint32 { return c.gen }

// errNoFD is Descriptor's answer for a connection without a socket.
var errNoFD = errors.New("hangup: connection has no file descriptor")

// Descriptor returns the socket descriptor of c, to be watched. Call it
// once per connection (it allocates); the descriptor stays valid while c is
// open.
func Descriptor(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, errNoFD
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := raw.Control(func(d uintptr) { fd = int(d) }); err != nil {
		return -1, err
	}
	return fd, nil
}
