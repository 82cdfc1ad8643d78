package router

import (
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingListener counts the connections it accepted that are still
// open: the worker's side, which its server closes once the router
// closed its own.
type countingListener struct {
	net.Listener
	open *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, open: l.open}, nil
}

type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if !c.closed.Swap(true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// A router's Close leaves no connection open to its workers, over TCP or a
// unix socket (requests' pooled connections, health probes' and the
// engine scrapes'), nor to the replicas it shares prefixes with or its
// trace collector. The scrapes', the socket probes', the prefix posts' and
// the span exports' stayed open, two goroutines each, until the other end
// or an idle timeout (a minute, 90 s) closed them. Nothing here closes an
// idle connection itself.
func TestCloseLeavesNoConnectionOpen(t *testing.T) {
	var open, sideOpen atomic.Int64
	side, err := net.Listen("tcp", "127.0.0.1:0") // a peer replica's admin listener and a collector
	require.NoError(t, err)
	var posts sync.Map // path: true
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		posts.Store(r.URL.Path, true)
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = srv.Serve(countingListener{Listener: side, open: &sideOpen}) }()
	t.Cleanup(func() { srv.Close() })
	sideURL := "http://" + side.Addr().String()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	sock, err := net.Listen("unix", filepath.Join(t.TempDir(), "w.sock"))
	require.NoError(t, err)
	var workers []dataplane.WorkerSpec
	var mocks []*mockworker.Worker
	t.Cleanup(func() { closeTogether(mocks) })
	for i, ln := range []net.Listener{tcp, sock} {
		m := mockworker.Serve(countingListener{Listener: ln, open: &open}, mockworker.Options{ID: uint64(i + 1), Tokens: 3})
		mocks = append(mocks, m)
		workers = append(workers, dataplane.WorkerSpec{ID: uint64(i + 1), URL: m.URL()})
	}
	f := startFleet(t, nil, func(c *config.Config) {
		c.Workers = workers
		c.Router.PrefixAffinity.Enabled = true
		c.Router.PrefixAffinity.BlockBytes = 16 // the test's prompts are short
		c.Router.PrefixAffinity.Peers = []string{sideURL}
		c.Tracing = tracing.Config{OTLPEndpoint: sideURL + "/v1/traces", SampleRatio: 1, ServiceName: "router-test"}
	})
	f.reachesBothWorkers() // probed, listed, scraped, and three requests each
	resp, body := f.send("POST", "/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":"a prompt of a few blocks, recorded"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Positive(t, open.Load())
	require.Eventually(t, func() bool {
		n := 0
		posts.Range(func(any, any) bool { n++; return true })
		return n == 2
	}, 5*time.Second, 10*time.Millisecond, "prefixes posted to the peer and spans to the collector")

	f.client.CloseIdleConnections()
	require.NoError(t, f.r.Close())
	assert.Eventually(t, func() bool { return open.Load() == 0 && sideOpen.Load() == 0 }, 2*time.Second, 10*time.Millisecond)
	assert.Zero(t, open.Load(), "connections to the workers still open after the router closed")
	assert.Zero(t, sideOpen.Load(), "connections to the peer and the collector still open after the router closed")
}
