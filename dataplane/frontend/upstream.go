package frontend

import (
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/puzpuzpuz/xsync/v3"
	"github.com/valyala/fasthttp"
)

// upstream is the keep-alive connection pool of one worker. fasthttp's
// HostClient keeps the pool (dialing, the connection limit, idle cleaning);
// the round trip is the front end's own (exchange.send), so an exchange
// knows the connection its request is on and can cut it when its client
// hangs up.
type upstream struct {
	hc       *fasthttp.HostClient
	conns    connPool
	host     string
	idHeader []byte // worker id as header text
}

// connPool lends the pooled connections of one worker. The handle is
// fasthttp's record of the connection, whose type is not exported.
type connPool interface {
	acquire() (handle any, c *trackedConn, err error)
	release(handle any, reuse bool) // reuse false: close it
}

// hostPool is a connPool over a HostClient's methods, with fasthttp's
// connection record type C inferred from them.
type hostPool[C interface{ Conn() net.Conn }] struct {
	acquireConn            func(reqTimeout time.Duration, connectionClose bool) (C, error)
	releaseConn, closeConn func(C)
}

func newHostPool[C interface{ Conn() net.Conn }](acquire func(time.Duration, bool) (C, error), release, closeConn func(C)) connPool {
	return &hostPool[C]{acquireConn: acquire, releaseConn: release, closeConn: closeConn}
}

func (p *hostPool[C]) acquire() (any, *trackedConn, error) {
	cc, err := p.acquireConn(0, false)
	if err != nil {
		return nil, nil, err
	}
	return cc, cc.Conn().(*trackedConn), nil
}

func (p *hostPool[C]) release(h any, reuse bool) {
	if reuse {
		p.releaseConn(h.(C))
		return
	}
	p.closeConn(h.(C))
}

func (s *Server) upstreamOf(w *dataplane.Worker) *upstream {
	if u, ok := s.upstreams.Load(w); ok {
		return u
	}
	u, _ := s.upstreams.LoadOrCompute(w, func() *upstream {
		host := w.Spec().Host()
		dialTimeout := s.opts.ConnectTimeout
		hc := &fasthttp.HostClient{
			Addr:                host,
			MaxConns:            4096,
			MaxIdleConnDuration: 90 * time.Second,
			Dial: func(addr string) (net.Conn, error) {
				c, err := fasthttp.DialTimeout(addr, dialTimeout)
				if err != nil {
					return nil, err
				}
				tc := &trackedConn{Conn: c, set: s.upConns, idle: s.opts.StreamIdleTimeout}
				s.upConns.Store(tc, struct{}{})
				return tc, nil
			},
		}
		return &upstream{
			hc:       hc,
			conns:    newHostPool(hc.AcquireConn, hc.ReleaseConn, hc.CloseConn),
			host:     host,
			idHeader: strconv.AppendUint(nil, w.ID(), 10),
		}
	})
	return u
}

// errClientGone ends a dispatch whose client closed its connection.
var errClientGone = errors.New("the client closed its connection")

// send writes the request on a pooled connection of u and reads the
// answer's headers, leaving its body to stream: an error means no byte of
// an answer came back, so the request may move to another worker. The
// first byte must come within first_byte_timeout; once bytes flow the
// connection's idle deadline takes over (trackedConn).
func (ex *exchange) send(u *upstream) error {
	h, c, err := u.conns.acquire()
	if err != nil {
		return err
	}
	ex.conn, ex.connHandle, ex.connOf = c, h, u
	c.owner.Store(ex.token)
	ex.upConn.Store(c)
	if ex.hungUp() { // the client left before the connection was published
		ex.endConn()
		return errClientGone
	}
	var deadline time.Time
	if d := ex.s.opts.FirstByteTimeout; d > 0 {
		deadline = time.Now().Add(d)
	}
	if err = c.SetDeadline(deadline); err == nil {
		bw := u.hc.AcquireWriter(c)
		if err = ex.up.Write(bw); err == nil {
			err = bw.Flush()
		}
		u.hc.ReleaseWriter(bw)
	}
	if err == nil {
		ex.br = u.hc.AcquireReader(c)
		ex.resp.StreamBody = true
		err = ex.resp.ReadLimitBody(ex.br, 0)
	}
	if err != nil {
		ex.endConn()
	}
	return err
}

// endConn gives the exchange's upstream connection back: to the pool when
// the answer was read to its end and nobody cut it, closed otherwise.
func (ex *exchange) endConn() {
	c := ex.conn
	if c == nil {
		return
	}
	ex.upConn.Store(nil)
	reuse := ex.bodyDone && !ex.resp.ConnectionClose() && ex.resp.Header.ContentLength() != -2 &&
		c.owner.CompareAndSwap(ex.token, 0)
	_ = ex.resp.CloseBodyStream()
	if ex.br != nil {
		ex.connOf.hc.ReleaseReader(ex.br)
		ex.br = nil
	}
	ex.connOf.conns.release(ex.connHandle, reuse)
	ex.conn, ex.connHandle, ex.connOf = nil, nil, nil
}

// cut closes the upstream connection of the exchange's request whose
// token is given, unless the exchange already gave it back. Closing the
// connection is how an engine learns to stop working on a request.
func (ex *exchange) cut(token uint32) {
	if c := ex.upConn.Load(); c != nil && c.owner.CompareAndSwap(token, 0) {
		_ = c.Conn.Close()
	}
}

// trackedConn is an upstream connection listed in set while open, so a
// shutdown that runs out of time can cut it. Once a read returns bytes, the
// next must come within idle (stream_idle_timeout): the deadline moves
// forward as bytes flow, at most every idle/8, so a stream that keeps
// sending is never cut, and reads cost no deadline call each.
type trackedConn struct {
	net.Conn
	set      *xsync.MapOf[net.Conn, struct{}]
	idle     time.Duration
	deadline time.Time     // the idle deadline last set; zero: the first-byte one
	owner    atomic.Uint32 // token of the exchange using it; 0: none, or cut
}

// Read reads and moves the idle deadline forward when bytes came.
func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.idle > 0 {
		now := time.Now()
		if next := now.Add(c.idle); next.Sub(c.deadline) > c.idle/8 {
			c.deadline = next
			_ = c.Conn.SetReadDeadline(next)
		}
	}
	return n, err
}

// SetDeadline sets the deadlines of a new request (send): the read one
// replaces the idle deadline until bytes flow again.
func (c *trackedConn) SetDeadline(t time.Time) error {
	c.deadline = time.Time{}
	return c.Conn.SetDeadline(t)
}

// Close closes the connection and drops it from the set.
func (c *trackedConn) Close() error {
	c.set.Delete(c)
	return c.Conn.Close()
}
