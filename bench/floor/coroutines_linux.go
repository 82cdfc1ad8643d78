package floor

import (
	"net"

	"github.com/fastroute/fastroute/internal/coloop"
)

// startCoroutines serves ln with the goroutine model's own code
// (serveConn) run as coroutines of one event loop (package coloop): the
// same blocking-style reads and writes, waiting through the loop instead
// of Go's poller.
func startCoroutines(ln *net.TCPListener, workers []string) (stop func(), err error) {
	l, err := coloop.New()
	if err != nil {
		return nil, err
	}
	l.Start()
	s := newServer(workers)
	s.accept(ln, func(nc net.Conn, end func()) {
		l.Go(func(t *coloop.Task) { // after Stop it does not run, and stop closes nc
			defer end()
			c, err := l.Conn(nc)
			if err != nil {
				return
			}
			defer c.Close()
			serveConn(c, s.pick, func(addr string) (net.Conn, error) { return dialInLoop(l, t, addr) })
		})
	})
	return func() { s.stop(ln, l.Stop) }, nil
}

// dialInLoop connects to a worker off the loop (Block), and adds the
// connection to the loop's set.
func dialInLoop(l *coloop.Loop, t *coloop.Task, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	t.Block(func() { c, err = dialTCP(addr) })
	if err != nil {
		return nil, err
	}
	cc, err := l.Conn(c)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return cc, nil
}
