package workerclient

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// A retired client's connection in use as it was retired is closed once
// its call ended, within the call's timeout and a margin, not left to its
// idle timeout; one idle then is closed at once.
func TestRetireClosesTheConnectionsOfCallsUnderWay(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var open atomic.Int64
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/slow" {
				time.Sleep(300 * time.Millisecond)
			}
		},
		ConnState: func(_ net.Conn, st fasthttp.ConnState) {
			switch st {
			case fasthttp.StateNew:
				open.Add(1)
			case fasthttp.StateClosed:
				open.Add(-1)
			}
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	c := TCP(Options{Name: "test", Timeout: time.Second, IdleFor: time.Hour}, nil, func(addr string, _ time.Duration) (net.Conn, error) {
		return net.Dial("tcp", addr)
	})
	get := func(path string) {
		status, _, err := c.Get(nil, "http://"+ln.Addr().String()+path)
		require.NoError(t, err)
		require.Equal(t, fasthttp.StatusOK, status)
	}
	get("/") // one connection, kept
	done := make(chan struct{})
	go func() { defer close(done); get("/slow") }() // on the kept one
	time.Sleep(100 * time.Millisecond)
	get("/") // a second connection, idle once this returns
	require.EqualValues(t, 2, open.Load())

	Retire(c, 500*time.Millisecond)
	assert.Eventually(t, func() bool { return open.Load() == 1 }, time.Second, 10*time.Millisecond, "the idle one closes at once")
	<-done
	time.Sleep(100 * time.Millisecond)
	assert.EqualValues(t, 1, open.Load(), "the one that was in use waits, idle, for the second sweep")
	assert.Eventually(t, func() bool { return open.Load() == 0 }, 3*time.Second, 10*time.Millisecond,
		"closed within the timeout and the margin, not the client's hour of idle time")
}
