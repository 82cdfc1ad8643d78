package router

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sendRaw writes a request on a new connection and leaves it open, unread.
func (f *fleet) sendRaw(body string) net.Conn {
	f.t.Helper()
	conn, err := net.Dial("tcp", f.r.Addr())
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = conn.Close() })
	_, err = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(f.t, err)
	return conn
}

// A client that hangs up while its request runs or waits in the engine's
// queue cuts the upstream request: the engine stops working on it, the
// reservation is released at once and the request counts as cancelled,
// not as a worker failure.
func TestAbandonedRequestsAreCutUpstream(t *testing.T) {
	engine := mockworker.Options{ID: 1, Engine: mockworker.EngineOptions{MaxNumSeqs: 1, InterTokenLatency: 20 * time.Millisecond}}
	f := startFleet(t, []mockworker.Options{engine}, nil)
	mock, w := f.mocks[0], f.r.Registry.All()[0]
	queue := func(running, waiting int) func() bool {
		return func() bool { r, q := mock.Queue(); return r == running && q == waiting }
	}
	long := `{"model":"mock-model","max_tokens":2000,"messages":[{"role":"user","content":"hi"}]}`
	longStream := `{"model":"mock-model","max_tokens":2000,"stream":true,"messages":[{"role":"user","content":"hi"}]}`

	running := f.sendRaw(long)
	require.Eventually(t, queue(1, 0), 5*time.Second, 5*time.Millisecond)
	waiting := f.sendRaw(long)
	waitingStream := f.sendRaw(longStream) // no byte of its answer yet: it waits too
	require.Eventually(t, queue(1, 2), 5*time.Second, 5*time.Millisecond)
	require.EqualValues(t, 3, w.Occupancy())

	require.NoError(t, waiting.Close())
	require.NoError(t, waitingStream.Close())
	require.Eventually(t, queue(1, 0), 5*time.Second, 5*time.Millisecond, "the engine still queues the abandoned requests")
	require.Eventually(t, func() bool { return w.Occupancy() == 1 }, 5*time.Second, 5*time.Millisecond)

	require.NoError(t, running.Close())
	require.Eventually(t, queue(0, 0), 5*time.Second, 5*time.Millisecond, "the engine still runs the abandoned request")
	f.assertIdle()

	m := f.r.Frontend.Metrics()
	assert.EqualValues(t, 3, m.Requests("/v1/chat/completions", "cancelled"))
	assert.Zero(t, m.Requests("/v1/chat/completions", "upstream_error"))
	assert.Zero(t, f.r.Registry.Ejections())

	// The worker and the router's connections to it still serve.
	resp := f.post("/v1/chat/completions", `{"model":"mock-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, 200, resp.StatusCode)
	readAll(t, resp)
	f.assertIdle()
}
