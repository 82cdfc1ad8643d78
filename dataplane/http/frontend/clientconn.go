package frontend

import (
	"crypto/tls"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fastroute/fastroute/dataplane/http/hangup"
)

// newClientConn wraps an accepted connection; with tlsConfig, the
// connection speaks TLS, read and written through crypto/tls rather than
// with raw system calls (its socket is still watched for the client's
// hang-up).
func newClientConn(c net.Conn, tlsConfig *tls.Config) *clientConn {
	if tlsConfig != nil {
		cc := &clientConn{Conn: tls.Server(c, tlsConfig)}
		cc.init(cc.Conn)
		if sc, ok := c.(syscall.Conn); ok {
			cc.sock, _ = sc.SyscallConn()
		}
		return cc
	}
	cc := &clientConn{Conn: c}
	cc.init(c)
	cc.sock = cc.raw
	cc.deferDeadlines()
	cc.readAfter = always // its next request may have come (pipelined)
	return cc
}

// clientCertName names the client of c by the certificate it showed in
// its TLS handshake (tls.client_ca_file checked it): its subject's common
// name, else its first URI name (a SPIFFE ID, as service meshes issue
// them, with no common name), else its first DNS name; empty for none. It
// is worked out at the connection's first request (its handshake is over
// by then) and kept: every request on a connection has the same client.
func clientCertName(c net.Conn) []byte {
	cc, ok := c.(*clientConn)
	if !ok {
		return nil
	}
	if !cc.certNamed {
		cc.certName, cc.certNamed = []byte(peerCertName(cc.Conn)), true
	}
	return cc.certName
}

// peerCertName is clientCertName of the connection c wraps.
func peerCertName(c net.Conn) string {
	t, ok := c.(*tls.Conn)
	if !ok {
		return ""
	}
	st := t.ConnectionState()
	if len(st.PeerCertificates) == 0 {
		return ""
	}
	switch cert := st.PeerCertificates[0]; {
	case cert.Subject.CommonName != "":
		return cert.Subject.CommonName
	case len(cert.URIs) > 0:
		return cert.URIs[0].String()
	case len(cert.DNSNames) > 0:
		return cert.DNSNames[0]
	}
	return ""
}

// clientConn is a client connection that reads a request's first bytes
// in one call. fasthttp, which holds no read buffer on an idle keep-alive
// connection (ReduceMemoryUsage), reads a request's first byte alone and
// then the rest: a read that finds nothing yet, the one byte, and the rest.
// Here that first read waits for the request and reads it ahead (sockIO),
// and the reads that follow take it from there: one system call fewer per
// request, whether or not it had already come.
type clientConn struct {
	net.Conn
	sockIO
	gate    *gate           // the gate it came through
	gen     *generation     // the generation that serves it (set as it is handed over)
	closed  atomic.Bool     // Close was called (the gate counted it closed)
	watch   hangup.Conn     // its hang-up watch (Server.trackConn)
	handoff atomic.Int32    // a take-over's and fasthttp's hand-off of the connection (handedOff)
	probed  bool            // a read of nothing came (pipelined)
	sock    syscall.RawConn // the socket, for the hang-up watcher (a TLS connection's too); nil: none
	linger  atomic.Bool     // its next Close lingers (lingerOnClose)
	// A PROXY protocol header is due before its first request
	// (gate.tookProxyHeader), and the client address one named (nil:
	// the peer's own).
	headerDue bool
	source    net.Addr
	// The client as its certificate names it (clientCertName), once
	// certNamed.
	certName  []byte
	certNamed bool
	// The requests it carried, this one included (Server.serve counts
	// them; a connection serves one request at a time).
	requests int
}

// peerOf returns a connection's peer address as the router names it, an
// IPv4-mapped address as IPv4; false for a peer without an IP address.
func peerOf(a net.Addr) (netip.AddrPort, bool) {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := tcp.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

// RemoteAddr is the client's address: the one its load balancer's PROXY
// protocol header named, else its peer's.
func (c *clientConn) RemoteAddr() net.Addr {
	if c.source != nil {
		return c.source
	}
	return c.Conn.RemoteAddr()
}

// spent says the connection carried max requests (0: no limit), so the
// answer to the one it carries now is its last.
func (c *clientConn) spent(max int) bool { return max > 0 && c.requests >= max }

// lingerTime bounds a lingering close (lingerOnClose).
const lingerTime = 2 * time.Second

// lingerOnClose has the connection's close linger, as nginx's
// lingering_close does: the answer to a request refused before it was read
// whole (413, 431, 400) leaves, the connection's write side closes, and
// what the client still sends is read and dropped, for up to lingerTime,
// until the client closes too. Closed at once, with the rest of the
// request unread, the socket would answer the client's next bytes with a
// reset, and a client that sends its whole request before it reads (as
// Python's http.client does) would get "connection reset" instead of the
// answer.
func (c *clientConn) lingerOnClose() {
	if c.lazy { // a plain socket: a TLS connection closes as it is
		c.linger.Store(true)
	}
}

// lingerRead is a lingering close's wait (lingerOnClose): the write side
// closed, it reads and drops what comes until the client's end, an error
// (another Close, say) or lingerTime.
func (c *clientConn) lingerRead() {
	tcp, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok || tcp.CloseWrite() != nil || c.Conn.SetReadDeadline(time.Now().Add(lingerTime)) != nil {
		return
	}
	bp := lentBufs.Get().(*[]byte)
	defer lentBufs.Put(bp)
	for {
		if _, err := c.Conn.Read(*bp); err != nil {
			return
		}
	}
}

func (c *clientConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		c.probed = true
		return 0, nil
	}
	if c.pending() {
		return c.take(p)
	}
	// Only fasthttp's read of a request's first byte reads ahead; when its
	// wait fails, so does the read.
	if len(p) != 1 || !c.await() {
		return c.read(p)
	}
	return c.take(p)
}

// SetReadDeadline, SetWriteDeadline and SetDeadline ask for deadlines
// that go on the socket only before a wait (sockIO.deferDeadlines):
// fasthttp asks for three per request, for reads and writes that most
// often do not wait.
func (c *clientConn) SetReadDeadline(t time.Time) error {
	if !c.lazy {
		return c.Conn.SetReadDeadline(t)
	}
	c.askRead(t)
	return nil
}

func (c *clientConn) SetWriteDeadline(t time.Time) error {
	if !c.lazy {
		return c.Conn.SetWriteDeadline(t)
	}
	c.askWrite(t)
	return nil
}

func (c *clientConn) SetDeadline(t time.Time) error {
	if !c.lazy {
		return c.Conn.SetDeadline(t)
	}
	c.askRead(t)
	c.askWrite(t)
	return nil
}

func (c *clientConn) Write(p []byte) (int, error) { return c.write(p) }

// Close closes the connection and, the first time, counts it closed in
// its gate's books of open connections, which fasthttp (a connection it
// served), a take-over (hijackConn.Close, Server.closeConn), the gate
// itself and Shutdown all close through.
func (c *clientConn) Close() error {
	if c.raw != nil {
		c.sendHeldAtClose()
	}
	if c.linger.Swap(false) { // once: another Close meanwhile ends the wait
		c.lingerRead()
	}
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) && c.gate != nil {
		c.gate.closedOne()
	}
	return err
}

// pipelined reports whether fasthttp read bytes past the request it
// hijacked the connection at (hc): the next request, sent before this
// one's answer. hc then reads through fasthttp's reader, which holds them,
// and not this connection; a read of nothing from hc tells which.
func (c *clientConn) pipelined(hc net.Conn) bool {
	c.probed = false
	_, _ = hc.Read(nil)
	return !c.probed
}

// handedOff is called by a take-over that gives the connection back
// (giveBack) and by fasthttp's goroutine that gave it up, once done with
// it (its StateHijacked, trackConn: it still drops the connection from
// fasthttp's own books after the take-over began). The second to come
// reports true: fasthttp may serve the connection again (continueConn).
func (c *clientConn) handedOff() bool { return c.handoff.Add(1) == 2 }

var errNotASocket = errors.New("the client connection is not a socket")

// SyscallConn is the socket's, for the hang-up watcher.
func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	if c.sock == nil {
		return nil, errNotASocket
	}
	return c.sock, nil
}
