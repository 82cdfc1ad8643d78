package router

import (
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Workers on unix sockets (url unix:/path, as vLLM's --uds serves): their
// requests whole and streamed on kept connections, probes, model listings
// and engine scrapes all go to the socket. A worker whose socket goes
// away fails its connects, and its requests move to the other.
func TestWorkersOnUnixSockets(t *testing.T) {
	dir := t.TempDir()
	var mocks []*mockworker.Worker
	f := startFleet(t, nil, func(c *config.Config) {
		for id := uint64(1); id <= 2; id++ {
			ln, err := net.Listen("unix", filepath.Join(dir, fmt.Sprintf("w%d.sock", id)))
			require.NoError(t, err)
			m := mockworker.Serve(ln, mockworker.Options{ID: id, Tokens: 3, TokenInterval: 5 * time.Millisecond})
			t.Cleanup(func() { m.Close() })
			mocks = append(mocks, m)
			c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: id, URL: m.URL()})
		}
	})
	require.True(t, strings.HasPrefix(mocks[0].URL(), "unix:/"), mocks[0].URL())
	f.reachesBothWorkers()

	mocks[1].Kill()
	require.Eventually(t, func() bool { return metric(t, f, `fastroute_worker_connections{worker="2"}`) == "0" }, 5*time.Second, 10*time.Millisecond,
		"the watch closed the pooled connection the worker closed")
	for range 4 {
		resp, text := f.send(http.MethodPost, "/v1/chat/completions", chatBody)
		require.Equal(t, http.StatusOK, resp.StatusCode, text)
		assert.Equal(t, "1", resp.Header.Get("x-fastroute-worker"))
	}
	assert.NotEqual(t, "0", metric(t, f, `fastroute_worker_failures_total{worker="2",reason="connect"}`))
	f.assertIdle()
}
