// Package workerclient makes the fasthttp clients of the router's own
// requests to its workers (health probes, model listings, engine metrics),
// all alike: connections kept alive, answers bounded, and a request that
// finds its kept-alive connection closed by the worker meanwhile (past the
// engine's keep-alive timeout, uvicorn's 5 s, when requests are further
// apart than that) made again on a new connection, once, as Go's client
// does; fasthttp's, with one attempt, fails it. The requests are GETs.
// Retire closes the connections of a client a reload replaced, one of
// these or the prefix posts' to peers.
package workerclient

import (
	"crypto/tls"
	"time"

	"github.com/valyala/fasthttp"
)

// Options configures a client.
type Options struct {
	Name    string        // the User-Agent
	Timeout time.Duration // of each read and write
	MaxBody int           // an answer longer fails (fasthttp.ErrBodyTooLarge)
	// IdleFor is how long an idle connection is kept (0: fasthttp's 10 s).
	IdleFor time.Duration
}

// attempts is how many times a request goes: again once on a new
// connection when the one it took was closed.
const attempts = 2

// TCP is a client of workers over TCP, speaking TLS to https:// ones by
// tlsConf (nil: the system's roots), dialing by dial (nil: fasthttp's).
func TCP(o Options, tlsConf *tls.Config, dial fasthttp.DialFuncWithTimeout) *fasthttp.Client {
	return &fasthttp.Client{Name: o.Name, ReadTimeout: o.Timeout, WriteTimeout: o.Timeout, MaxIdleConnDuration: o.IdleFor,
		MaxIdemponentCallAttempts: attempts, MaxResponseBodySize: o.MaxBody, TLSConfig: tlsConf, DialTimeout: dial}
}

// Socket is a client of the worker whose connections dial makes (a unix
// socket's); host is the Host its requests name.
func Socket(o Options, host string, dial fasthttp.DialFunc) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: host, Name: o.Name, ReadTimeout: o.Timeout, WriteTimeout: o.Timeout, MaxIdleConnDuration: o.IdleFor,
		MaxIdemponentCallAttempts: attempts, MaxResponseBodySize: o.MaxBody, Dial: dial}
}

// Retire closes the idle connections of c, a client a new one replaced,
// now and again once every call under way on it has ended (each within
// timeout): a connection in use as it was replaced is closed then, not
// left open to its idle timeout (a minute for the engine scrapes).
func Retire(c interface{ CloseIdleConnections() }, timeout time.Duration) {
	c.CloseIdleConnections()
	time.AfterFunc(timeout+retireMargin, c.CloseIdleConnections)
}

// retireMargin is how long after its timeout a call may take to give its
// connection back.
const retireMargin = time.Second
