package frontend

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// gate is the listener fasthttp serves: it hands fasthttp a client
// connection only once the connection's next request has come (its first
// bytes are read ahead), a new connection as well as one a stream gave
// back (giveBack). fasthttp binds a serving goroutine to a connection from
// then until it closes or is taken over; before, a connection waits in a
// goroutine of the gate's with a 2 KiB stack, not in a serving goroutine,
// which grows to 8 KiB as it serves and stays in fasthttp's worker pool
// with it. A burst of new streams so needs only as many serving goroutines
// as the requests read at once, and a connection that idles between
// streams holds no serving goroutine.
type gate struct {
	net.Listener
	ready  chan net.Conn // connections whose request has come, for Accept
	failed chan error    // the listener's failure, for Accept
	closed chan struct{}
	close  sync.Once
	// Connections waiting for their request, closed with the gate, each
	// with the time its wait began if the gate had stopped accepting
	// then (Unix nanoseconds; 0: before).
	waiting *xsync.MapOf[*clientConn, int64]
	handing atomic.Int64 // connections whose request came, on their way to Accept
	// When stopAccepting was first called (Unix nanoseconds; 0: not
	// yet): the listener's close is then no failure, and the connections
	// waiting linger from then (closeLingering).
	stoppedAt atomic.Int64
	lnClose   sync.Once // the listener's close (closeListener)
	lnErr     error
	gateOptions
	// Client connections open at once: the ones accepted and not yet
	// closed, and a close that made room under the most, for accept.
	open atomic.Int64
	room chan struct{}
	// How long a new connection may wait for its first request, and one
	// given back for its next (nanoseconds, 0: no limit; setWaits).
	first, idle atomic.Int64
}

// gateOptions are what a gate is made with.
type gateOptions struct {
	drop  func(net.Conn)                       // closes a connection and forgets it (Server.closeConn)
	short func(err error, pause time.Duration) // tells of an accept that failed for want of resources (Server.acceptShort)
	max   *atomic.Int64                        // client connections open at once, at most (limits.max_connections; Server.SetMaxConnections)
	full  func()                               // tells of the listener stopped at max (Server.connectionsFull)
	tls   *atomic.Pointer[tls.Config]          // connections speak TLS (nil: plain HTTP; Server.SetListenerTLS)
	// proxy has connections from a load balancer begin with a PROXY
	// protocol header (nil: none does; Server.SetProxyProtocol), and
	// refused tells of one that sent none, or a malformed one
	// (Server.proxyRefused).
	proxy   *atomic.Pointer[ProxyProtocol]
	refused func(err error, peer net.Addr)
}

// newGate has the connections of ln wait for their requests in a gate, a
// new one up to first, one given back up to idle (setWaits).
func newGate(ln net.Listener, first, idle time.Duration, o gateOptions) *gate {
	g := &gate{Listener: ln, ready: make(chan net.Conn), failed: make(chan error, 1), closed: make(chan struct{}),
		waiting: xsync.NewMapOf[*clientConn, int64](), gateOptions: o, room: make(chan struct{}, 1)}
	g.setWaits(first, idle)
	go g.accept()
	return g
}

// Pauses after an accept that failed for want of resources: the first,
// and the most they double to (as net/http's).
const (
	firstAcceptPause = 5 * time.Millisecond
	lastAcceptPause  = time.Second
)

// accept takes the listener's connections into the gate until it fails.
// With max connections open it accepts none until one closes: the next
// wait in the kernel's listen queue, as HAProxy's maxconn has them. An
// accept that fails for want of resources (resourceShortage) fails that
// accept, not the listener: the gate pauses, 5 ms doubling up to 1 s, and
// accepts again, the connection waiting in the kernel's queue meanwhile.
func (g *gate) accept() {
	var pause time.Duration
	for {
		g.holdAtMax()
		c, err := g.Listener.Accept()
		if err != nil && resourceShortage(err) {
			pause = min(max(2*pause, firstAcceptPause), lastAcceptPause)
			g.short(err, pause)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-g.closed: // the next accept fails as closed
				t.Stop()
			}
			continue
		}
		if err != nil {
			if g.stoppedAt.Load() == 0 {
				g.failed <- err
			}
			return
		}
		pause = 0
		g.holdAtMax() // a bound lowered while the accept waited: this one waits too, unserved
		g.open.Add(1)
		cc := newClientConn(c, g.tls.Load())
		cc.gate = g
		if p := g.proxy.Load(); p != nil {
			cc.headerDue = p.expects(c.RemoteAddr())
		}
		go g.wait(cc, time.Duration(g.first.Load()))
	}
}

// holdAtMax waits, while max connections or more are open, until fewer
// are or the gate closes.
func (g *gate) holdAtMax() {
	if g.open.Load() < g.max.Load() {
		return
	}
	g.full()
	for g.open.Load() >= g.max.Load() {
		select {
		case <-g.room:
		case <-g.closed:
			return
		}
	}
}

// closedOne counts a connection of the gate's closed (clientConn.Close),
// and tells accept of the room it made.
func (g *gate) closedOne() {
	if g.open.Add(-1) < g.max.Load() {
		g.madeRoom()
	}
}

// madeRoom tells accept that it may accept again (a connection closed, or
// a larger max).
func (g *gate) madeRoom() {
	select {
	case g.room <- struct{}{}:
	default: // accept has been told already
	}
}

// resourceShortage says whether an accept failed for want of file
// descriptors (the process's or the system's) or of kernel memory, which
// a later one may have.
func resourceShortage(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// Accept returns the next connection whose request has come.
func (g *gate) Accept() (net.Conn, error) { return g.acceptUntil(nil) }

// acceptUntil is Accept, which returns io.EOF once until is closed (nil:
// never).
func (g *gate) acceptUntil(until <-chan struct{}) (net.Conn, error) {
	select {
	case c := <-g.ready:
		return c, nil
	case err := <-g.failed:
		g.failed <- err // for the next call
		return nil, err
	case <-g.closed:
		return nil, net.ErrClosed
	case <-until:
		return nil, io.EOF
	}
}

// stopAccepting closes the listener but not the gate: the connections
// waiting in it still go to Accept as their requests come, for up to
// drainLinger from now or from the start of their wait, whichever is
// later (closeLingering), until Close.
func (g *gate) stopAccepting() {
	g.stoppedAt.CompareAndSwap(0, time.Now().UnixNano())
	_ = g.closeListener()
}

// closeLingering closes the connections that have waited for a request
// for drainLinger since the gate stopped accepting, and says whether none is
// left in the gate but those (each sent its request and went to Accept,
// or was closed).
func (g *gate) closeLingering() (settled bool) {
	now := time.Now().UnixNano()
	settled = g.handing.Load() == 0
	stopped := g.stoppedAt.Load()
	g.waiting.Range(func(cc *clientConn, since int64) bool {
		if now-max(since, stopped) >= int64(drainLinger) {
			_ = cc.Close() // its wait fails, and drops it
		} else {
			settled = false
		}
		return true
	})
	return settled
}

// closeListener closes the listener the first time it is called.
func (g *gate) closeListener() error {
	g.lnClose.Do(func() { g.lnErr = g.Listener.Close() })
	return g.lnErr
}

// Close closes the listener and the connections waiting in the gate (idle
// ones, which fasthttp closes at Shutdown).
func (g *gate) Close() error {
	err := g.closeListener()
	g.close.Do(func() { close(g.closed) })
	g.waiting.Range(func(cc *clientConn, _ int64) bool {
		_ = cc.Close()
		return true
	})
	return err
}

// giveBack has a connection fasthttp served wait in the gate for its next
// request.
func (g *gate) giveBack(cc *clientConn) { go g.wait(cc, time.Duration(g.idle.Load())) }

// setWaits bounds the waits for a request that begin from now on: a new
// connection's for its first by first, one given back's for its next by
// idle (0: no limit).
func (g *gate) setWaits(first, idle time.Duration) {
	g.first.Store(int64(first))
	g.idle.Store(int64(idle))
}

// wait waits for the connection's request, up to timeout, then hands it
// to Accept; one that sends nothing in time, or whose wait the gate's
// close cut, is closed (and forgotten, if it was served before).
func (g *gate) wait(cc *clientConn, timeout time.Duration) {
	var since int64
	if g.stoppedAt.Load() != 0 {
		since = time.Now().UnixNano()
	}
	g.waiting.Store(cc, since)
	var ok bool
	select {
	case <-g.closed:
		ok = false
	default:
		if timeout > 0 {
			_ = cc.SetReadDeadline(time.Now().Add(timeout))
		}
		// A connection that is not a socket, or speaks TLS (whose
		// handshake fasthttp's first read makes), goes on at once.
		ok = g.tookProxyHeader(cc) && (cc.raw == nil || cc.await())
		if timeout > 0 {
			_ = cc.SetReadDeadline(time.Time{}) // fasthttp sets its own
		}
	}
	if ok {
		g.handing.Add(1)
		g.waiting.Delete(cc)
		select {
		case g.ready <- cc:
			g.handing.Add(-1)
			return
		case <-g.closed:
		}
		g.handing.Add(-1)
	} else {
		g.waiting.Delete(cc)
	}
	g.drop(cc)
}

// tookProxyHeader reads a new connection's PROXY protocol header when its
// peer must send one (gateOptions.proxy), under the wait's deadline, and
// says whether it may go on: one that sent none, or a malformed one, is
// refused.
func (g *gate) tookProxyHeader(cc *clientConn) bool {
	if !cc.headerDue {
		return true
	}
	cc.headerDue = false
	var src net.Addr
	err := errNotASocket
	if cc.sock != nil {
		cc.syncReadDeadline() // a lazy socket's: the one asked goes on it
		src, err = readProxyHeader(cc.sock)
	}
	if err != nil {
		if !errors.Is(err, net.ErrClosed) { // the gate's close, not the peer's fault
			g.refused(err, cc.Conn.RemoteAddr())
		}
		return false
	}
	cc.source = src
	return true
}
