package floor

import (
	"net"
	"sync"
	"sync/atomic"
)

// startGoroutines serves ln with a goroutine per client connection.
func startGoroutines(ln *net.TCPListener, workers []string) (stop func()) {
	s := newServer(workers)
	s.accept(ln, func(c net.Conn, end func()) {
		go func() {
			defer end()
			serveConn(c, s.pick, dialTCP)
		}()
	})
	return func() { s.stop(ln, nil) }
}

// server is what the goroutine and coroutine models share: the workers'
// pools, the round robin over them, and the client connections open.
type server struct {
	pools []*pool
	next  atomic.Uint32
	conns sync.Map // open client connections, closed by stop
	done  chan struct{}
}

func newServer(workers []string) *server {
	s := &server{pools: make([]*pool, len(workers)), done: make(chan struct{})}
	for i, w := range workers {
		s.pools[i] = &pool{addr: w}
	}
	return s
}

// pick is the round robin's next pool.
func (s *server) pick() *pool { return s.pools[s.next.Add(1)%uint32(len(s.pools))] }

// accept takes ln's connections until ln closes, each to start, which
// starts its serving and has end called once that ended (end closes it).
func (s *server) accept(ln net.Listener, start func(c net.Conn, end func())) {
	go func() {
		defer close(s.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Store(c, nil)
			start(c, func() {
				s.conns.Delete(c)
				_ = c.Close()
			})
		}
	}()
}

// stop closes ln, waits for accept to end, calls then (nil: none), and
// closes the client connections still open and the workers' pools.
func (s *server) stop(ln net.Listener, then func()) {
	_ = ln.Close()
	<-s.done
	if then != nil {
		then()
	}
	s.conns.Range(func(c, _ any) bool { _ = c.(net.Conn).Close(); return true })
	for _, p := range s.pools {
		p.close()
	}
}

// pool keeps a worker's idle connections.
type pool struct {
	addr   string
	mu     sync.Mutex
	idle   []*reader
	closed bool // stop closed it: a connection given back is closed
}

// dialTCP connects to a worker.
func dialTCP(addr string) (net.Conn, error) { return net.Dial("tcp", addr) }

// get lends an idle connection, or one dial makes.
func (p *pool) get(dial func(addr string) (net.Conn, error)) (*reader, error) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		u := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return u, nil
	}
	p.mu.Unlock()
	c, err := dial(p.addr)
	if err != nil {
		return nil, err
	}
	return newReader(c), nil
}

func (p *pool) put(u *reader) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = u.c.Close()
		return
	}
	p.idle = append(p.idle, u)
}

func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, u := range p.idle {
		_ = u.c.Close()
	}
	p.idle, p.closed = nil, true
}

// reader reads one connection's messages into a buffer of its own.
type reader struct {
	c    net.Conn
	buf  []byte // bytes read, [0, n)
	n    int
	used int // bytes of buf taken by the message at hand
}

func newReader(c net.Conn) *reader { return &reader{c: c, buf: make([]byte, 16<<10)} }

// readMore reads what comes after buf's n bytes, growing buf when full.
func (r *reader) readMore() error {
	if r.n == len(r.buf) {
		r.buf = append(r.buf, make([]byte, len(r.buf))...)
	}
	k, err := r.c.Read(r.buf[r.n:])
	r.n += k
	return err
}

// next drops the message at hand, keeping what followed it.
func (r *reader) next() {
	r.n = copy(r.buf, r.buf[r.used:r.n])
	r.used = 0
}

// readHead reads until a whole head is at the front of buf.
func (r *reader) readHead() (head, error) {
	for {
		h, ok, err := parseHead(r.buf[:r.n])
		if ok || err != nil {
			return h, err
		}
		if err := r.readMore(); err != nil {
			return head{}, err
		}
	}
}

// serveConn serves a client connection's requests one after the other,
// on worker connections dial makes.
func serveConn(c net.Conn, pick func() *pool, dial func(addr string) (net.Conn, error)) {
	cr := newReader(c)
	for {
		h, err := cr.readHead()
		if err != nil || h.chunked {
			return // the floor's clients send bodies by length
		}
		for cr.n < h.size+h.length {
			if err := cr.readMore(); err != nil {
				return
			}
		}
		cr.used = h.size + h.length
		p := pick()
		u, err := p.get(dial)
		if err != nil {
			return
		}
		if _, err := u.c.Write(cr.buf[:cr.used]); err != nil || relayAnswer(u, c) != nil {
			_ = u.c.Close()
			return
		}
		u.next()
		p.put(u)
		cr.next()
	}
}

// relayAnswer passes the worker's answer to the client: whole in one write
// when its length is known, else (a stream) what came of it at each read.
func relayAnswer(u *reader, c net.Conn) error {
	h, err := u.readHead()
	if err != nil {
		return err
	}
	b := newBody(h)
	if !h.chunked {
		for u.n < h.size+h.length {
			if err := u.readMore(); err != nil {
				return err
			}
		}
		u.used = h.size + h.length
		_, err := c.Write(u.buf[:u.used])
		return err
	}
	from := 0 // what of buf the client has
	u.used = h.size
	for {
		n, done, err := b.scan(u.buf[u.used:u.n])
		if err != nil {
			return err
		}
		u.used += n
		if _, err := c.Write(u.buf[from:u.used]); err != nil {
			return err
		}
		if done {
			return nil
		}
		u.n, u.used, from = 0, 0, 0 // the chunks so far left: read the next ones from the start
		if err := u.readMore(); err != nil {
			return err
		}
	}
}
