package floor

import (
	"net"
	"sync"
	"sync/atomic"

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
	pools := make([]*pool, len(workers))
	for i, w := range workers {
		pools[i] = &pool{addr: w}
	}
	var next atomic.Uint32
	pick := func() *pool { return pools[next.Add(1)%uint32(len(pools))] }
	var conns sync.Map // client connections accepted, closed by stop (a task's may never have started)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(nc, nil)
			l.Go(func(t *coloop.Task) {
				defer conns.Delete(nc)
				defer nc.Close()
				c, err := l.Conn(nc)
				if err != nil {
					return
				}
				defer c.Close()
				serveConn(c, pick, func(addr string) (net.Conn, error) { return dialInLoop(l, t, addr) })
			})
		}
	}()
	return func() {
		_ = ln.Close()
		<-done
		l.Stop()
		conns.Range(func(c, _ any) bool { _ = c.(net.Conn).Close(); return true })
		for _, p := range pools {
			p.close()
		}
	}, nil
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
