package router

import (
	"net/http"
	"testing"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A backup worker (backup: true) is sent requests only while the others
// cannot take them: at their cap, or out of rotation.
func TestABackupWorkerTakesWhatTheOthersCannot(t *testing.T) {
	f := startFleet(t, []mockworker.Options{{ID: 1, Tokens: 5000}, {ID: 2, Tokens: 5000}}, func(c *config.Config) {
		c.Router.Mode, c.Router.BusyThreshold = pickers.ModeLeastLoaded, 1
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
