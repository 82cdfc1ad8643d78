package router

import (
	"net/http"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A backup worker (backup: true) is sent requests only while the others
// cannot take them: at their cap, or out of rotation.
func TestABackupWorkerTakesWhatTheOthersCannot(t *testing.T) {
	// Worker 1 simulates an engine, so that the stream held on it (5,000
	// tokens 2 ms apart) lasts 10 s while a request of 2 tokens takes a
	// few: as a plain mock its chunks came back to back and could all fit
	// in the loopback sockets' buffers, ending the stream, and freeing
	// worker 1, before the next request (a CI failure). Its metrics are
	// not read: the router's own counts decide, as before.
	engine := mockworker.EngineOptions{MaxNumSeqs: 4, InterTokenLatency: 2 * time.Millisecond}
	f := startFleet(t, []mockworker.Options{{ID: 1, Tokens: 5000, Engine: engine}, {ID: 2, Tokens: 5000}}, func(c *config.Config) {
		c.Router.Mode, c.Router.BusyThreshold = pickers.ModeLeastLoaded, 1
		c.Telemetry.Engine.Enabled = false
		c.Workers[1].Backup = true
	})
	assert.Equal(t, true, f.workerInfo(2)["backup"])
	for range 4 {
		assert.Equal(t, "1", f.servedBy("/v1/chat/completions", `{"model":"mock-model","max_tokens":2,"messages":[]}`), "worker 1 is free")
	}
	held := f.post("/v1/chat/completions", streamBody, "x-worker-id", "1")
	require.Equal(t, http.StatusOK, held.StatusCode)
	assert.Equal(t, "2", f.servedBy("/v1/chat/completions", `{"model":"mock-model","max_tokens":2,"messages":[]}`), "worker 1 at its cap")
	held.Body.Close()
	f.assertIdle()
	assert.Equal(t, "1", f.servedBy("/v1/chat/completions", `{"model":"mock-model","max_tokens":2,"messages":[]}`), "worker 1 free again")

	code, body := adminDo(t, f, "DELETE", "/workers/1", "", "")
	require.Equal(t, http.StatusAccepted, code, body)
	assert.Equal(t, "2", f.servedBy("/v1/chat/completions", `{"model":"mock-model","max_tokens":2,"messages":[]}`), "worker 1 drained")
	f.assertIdle()
}
