package frontend

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// How a failed dispatch is told to the client, and whether it may move to
// another worker: a timeout never (the worker may still be working).
func TestTransportFailuresAreNamedAndClassified(t *testing.T) {
	refused := &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	cases := []struct {
		err       error
		says      string
		retryable bool
	}{
		{refused, "connection refused", true},
		{fmt.Errorf("write: %w", syscall.ECONNRESET), "connection reset", true},
		{fasthttp.ErrDialTimeout, "connect timed out (limits.connect_timeout)", true},
		{fasthttp.ErrTimeout, "no answer within limits.first_byte_timeout", false},
		{io.ErrUnexpectedEOF, "connection closed before the answer", true},
		{fasthttp.ErrBodyTooLarge, fasthttp.ErrBodyTooLarge.Error(), false},
	}
	for _, c := range cases {
		assert.Equal(t, c.says, transportFailure(c.err), "%v", c.err)
		assert.Equal(t, c.retryable, retryable(c.err), "%v", c.err)
	}
	assert.True(t, isTimeout(&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}))
	assert.False(t, isTimeout(errors.New("other")))
}

// The pool over a HostClient lends tracked connections and takes them
// back: a released one is lent again, a closed one leaves the set.
func TestHostPoolLendsTrackedConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}()
	set := xsync.NewMapOf[net.Conn, struct{}]()
	hc := &fasthttp.HostClient{Addr: ln.Addr().String(), MaxConns: 4, MaxIdleConnDuration: time.Minute,
		Dial: func(addr string) (net.Conn, error) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			tc := &trackedConn{Conn: c, set: set}
			set.Store(tc, struct{}{})
			return tc, nil
		}}
	pool := newHostPool(hc.AcquireConn, hc.ReleaseConn, hc.CloseConn)
	h, c, err := pool.acquire()
	require.NoError(t, err)
	pool.release(h, true)
	h2, c2, err := pool.acquire()
	require.NoError(t, err)
	assert.Same(t, c, c2, "a released connection is lent again")
	pool.release(h2, false)
	assert.Zero(t, set.Size(), "a closed connection leaves the set")
	assert.Zero(t, hc.ConnsCount())
}
