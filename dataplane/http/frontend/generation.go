package frontend

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// ClientLimits are a client connection's own bounds, those fasthttp reads
// as it serves the connection (the fields of the fasthttp server made with
// them) and the gate's waits for a request.
type ClientLimits struct {
	MaxBodyBytes   int
	MaxHeaderBytes int           // request line and headers (431 above); 0: fasthttp's 4 KiB
	ReadTimeout    time.Duration // client request read (headers and body)
	WriteTimeout   time.Duration // client response write
	IdleTimeout    time.Duration // keep-alive idle
}

// idle is how long a kept-alive connection may wait for its next request:
// IdleTimeout, else ReadTimeout (fasthttp's rule).
func (l ClientLimits) idle() time.Duration { return cmp.Or(l.IdleTimeout, l.ReadTimeout) }

// generation is a fasthttp server made with one set of ClientLimits: it
// serves the connections the gate hands it until a reload sets other
// limits (SetClientLimits), then serves only those it has, each until it
// closes or is taken over: a connection a stream gives back, and one whose
// request it answered once it retired (Server.moveOn), goes to the gate
// again, and to the generation that accepts then.
type generation struct {
	srv    *fasthttp.Server
	limits ClientLimits
	open   atomic.Int64  // connections it serves: handed to it, not yet closed or taken over
	retire chan struct{} // closed when the next generation takes the gate's connections
	// Its Serve began, and returned: it is handed no more connections
	// once it returned, or if it retired before it began.
	started, ended atomic.Bool
}

// newGeneration makes the fasthttp server of a generation that bounds its
// connections by l.
func (s *Server) newGeneration(l ClientLimits) *generation {
	gen := &generation{limits: l, retire: make(chan struct{})}
	gen.srv = &fasthttp.Server{
		Handler:            s.serve,
		Name:               "fastroute",
		MaxRequestBodySize: l.MaxBodyBytes,
		ReadBufferSize:     l.MaxHeaderBytes,
		// The read buffer holds the whole header, so it is as large as
		// max_header_bytes; keep it only while a request is read, not for
		// every open connection and stream.
		ReduceMemoryUsage: true,
		// A response goes in one write up to this size; its writer, like
		// the read buffer, is lent only while it is written.
		WriteBufferSize: answerWriteBuffer,
		// fasthttp's own messages never quote request contents (headers
		// may carry credentials).
		SecureErrorLogMessage: true,
		ReadTimeout:           l.ReadTimeout,
		WriteTimeout:          l.WriteTimeout,
		IdleTimeout:           l.IdleTimeout,
		NoDefaultDate:         true,
		// Nothing reads a request's RequestCtx.Time: no clock read for it.
		LazyRequestTime:      true,
		NoDefaultContentType: true,
		CloseOnShutdown:      true,
		KeepHijackedConns:    true, // a take-over gives them back (giveBack)
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			s.readError(ctx, err, l)
		},
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			switch st {
			case fasthttp.StateNew:
				gen.open.Add(1)
				if cc, ok := c.(*clientConn); ok {
					cc.gen = gen
				}
			case fasthttp.StateClosed, fasthttp.StateHijacked:
				gen.open.Add(-1)
			}
			s.trackConn(c, st)
		},
		Logger:                       debugLogger{s.log},
		DisablePreParseMultipartForm: true,
	}
	return gen
}

// generationListener is the gate as one generation's fasthttp server
// sees it: its Accept ends (io.EOF, which ends fasthttp's Serve without an
// error) once the generation retires.
type generationListener struct {
	*gate
	retire chan struct{}
}

// Accept returns the gate's next connection, or io.EOF once the
// generation retired. A connection handed over as it retires is still
// served by it.
func (l generationListener) Accept() (net.Conn, error) {
	select {
	case <-l.retire:
		return nil, io.EOF
	default:
		return l.acceptUntil(l.retire)
	}
}

// SetClientLimits bounds the client connections handed to fasthttp from
// now on by l: the new ones, those that a stream gives back or that wait
// for their next request in the gate, once it comes, and those fasthttp
// serves, from the request after the one they carry or wait for now (its
// answer leaves from a take-over, which gives the connection back:
// Server.moveOn). fasthttp's server reads the bounds unsynchronised, so
// the next ones are another server's, a generation's; a request it began
// to wait for is read under the bounds it waited with. The gate's waits
// for a request follow l from the next wait on.
func (s *Server) SetClientLimits(l ClientLimits) {
	s.gensMu.Lock()
	defer s.gensMu.Unlock()
	cur := s.current.Load()
	if cur.limits == l || s.closing.Load() {
		return
	}
	next := s.newGeneration(l)
	kept := s.gens[:0]
	for _, gen := range s.gens {
		if gen == cur || gen.open.Load() > 0 || (gen.started.Load() && !gen.ended.Load()) {
			kept = append(kept, gen)
		}
	}
	clear(s.gens[len(kept):])
	s.gens = append(kept, next)
	s.current.Store(next)
	if g := s.gate.Load(); g != nil {
		g.setWaits(l.ReadTimeout, l.idle())
	}
	close(cur.retire) // its Serve returns, and Serve serves next's
}

// serveGenerations has each generation's fasthttp server serve the gate's
// connections in turn, until the gate closes or fails.
func (s *Server) serveGenerations(g *gate) error {
	for {
		gen := s.current.Load() // one that retired already serves nothing
		gen.started.Store(true)
		err := gen.srv.Serve(generationListener{gate: g, retire: gen.retire})
		gen.ended.Store(true)
		select {
		case <-gen.retire:
			if err == nil && !s.closing.Load() {
				continue
			}
		default:
		}
		return err
	}
}

// serving returns how many client connections fasthttp serves, in every
// generation.
func (s *Server) serving() (n int64) {
	s.gensMu.Lock()
	defer s.gensMu.Unlock()
	for _, gen := range s.gens {
		n += gen.open.Load()
	}
	return n
}

// shutdownGenerations shuts every generation's fasthttp server down (the
// first closes the gate): each closes its idle connections and waits for
// the others until ctx ends.
func (s *Server) shutdownGenerations(ctx context.Context) error {
	s.gensMu.Lock()
	gens := append([]*generation(nil), s.gens...)
	s.gensMu.Unlock()
	var errs []error
	for _, gen := range gens {
		if err := gen.srv.ShutdownWithContext(ctx); err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil {
				break
			}
		}
	}
	return errors.Join(errs...)
}
