package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A worker whose engine is put to sleep (vLLM's sleep mode: POST /sleep,
// its weights off the GPU, its /health still 200) leaves rotation once its
// metrics say so, and comes back once they say it is awake: its requests
// go to the other worker meanwhile, a session pinned to it moves, and a
// request that names it is refused saying why.
func TestASleepingEngineIsOutOfRotation(t *testing.T) {
	f := startFleet(t, mocks(2, 2, 0), func(c *config.Config) {
		c.Telemetry.Engine.Interval = 20 * time.Millisecond
		c.Router.SessionAffinity.Mode = "soft"
	})
	asleep := func() map[uint64]bool {
		code, text := adminDo(t, f, "GET", "/workers", "", "")
		require.Equal(t, http.StatusOK, code, text)
		var all []struct {
			ID     uint64 `json:"id"`
			Asleep bool   `json:"asleep"`
		}
		require.NoError(t, json.Unmarshal([]byte(text), &all))
		out := map[uint64]bool{}
		for _, w := range all {
			out[w.ID] = w.Asleep
		}
		return out
	}
	engine := func(path string) {
		resp, err := f.client.Post(f.mocks[0].URL()+path, "", nil)
		require.NoError(t, err)
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	// Until worker 1's engine sleeps, both take requests and sessions.
	session := ""
	for i := 0; session == ""; i++ {
		require.Less(t, i, 32, "a session is placed on worker 1")
		if id := fmt.Sprintf("s%d", i); f.servedBy("/v1/chat/completions", chatBody, "x-session-id", id) == "1" {
			session = id
		}
	}
	assert.Equal(t, "1", f.servedBy("/v1/chat/completions", chatBody, "x-session-id", session), "pinned")
	assert.Equal(t, map[uint64]bool{1: false, 2: false}, asleep())
	assert.Equal(t, "0", metric(t, f, `fastroute_worker_asleep{worker="1"}`))

	engine("/sleep?level=1")
	// The flag, then the routable snapshot the registry publishes just
	// after it: the requests below are routed on the snapshot.
	require.Eventually(t, func() bool { return asleep()[1] && !f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond,
		"GET /workers shows the engine asleep")
	assert.Equal(t, "1", metric(t, f, `fastroute_worker_asleep{worker="1"}`))
	assert.Equal(t, "0", metric(t, f, `fastroute_worker_asleep{worker="2"}`))
	served := f.mocks[0].Served()
	for range 8 {
		assert.Equal(t, "2", f.servedBy("/v1/chat/completions", chatBody))
	}
	assert.Equal(t, "2", f.servedBy("/v1/chat/completions", chatBody, "x-session-id", session), "the session moved")
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "x-worker-id", "1")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	assert.Contains(t, body, "worker 1 is not routable (asleep)")
	assert.Equal(t, served, f.mocks[0].Served(), "nothing reached the sleeping engine")
	assert.True(t, f.mocks[0].Asleep())

	engine("/wake_up")
	require.Eventually(t, func() bool { return !asleep()[1] && f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond,
		"GET /workers shows the engine awake")
	workers := map[string]int{}
	for range 8 {
		workers[f.servedBy("/v1/chat/completions", chatBody)]++
	}
	assert.Equal(t, map[string]int{"1": 4, "2": 4}, workers, "back in rotation")
	resp, body = f.send("POST", "/v1/chat/completions", chatBody, "x-worker-id", "1")
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	f.assertIdle()
}

// A reload turns the engine scrapes on (the workers' readings come, a
// sleeping engine leaves rotation) and off (the readings are withdrawn:
// every worker is routed on the router's own signals again, the sleeping
// one judged by its probes, whose /health answers 200).
func TestAReloadTurnsEngineMetricsOnAndOff(t *testing.T) {
	f := startFleet(t, mocks(2, 2, 0), func(c *config.Config) {
		c.Telemetry.Engine.Enabled, c.Telemetry.Engine.Interval = false, 20*time.Millisecond
	})
	resp, err := f.client.Post(f.mocks[0].URL()+"/sleep?level=1", "", nil)
	require.NoError(t, err)
	readAll(t, resp)
	time.Sleep(100 * time.Millisecond) // five intervals: no scrape
	assert.Nil(t, f.workerInfo(1)["engine_source"], "no engine read")
	assert.True(t, f.r.Registry.Snapshot().Has(1), "the router does not know it sleeps")
	assert.Empty(t, metric(t, f, "fastroute_engine_workers_without_reading"))

	next := f.r.CurrentConfig()
	next.Telemetry.Engine.Enabled = true
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"telemetry.engine.enabled=true telemetry.engine.interval=20ms telemetry.engine.timeout=" +
		next.Telemetry.Engine.Timeout.String() + " telemetry.engine.stall_after=0s"}, applied)
	assert.Empty(t, needRestart)
	require.Eventually(t, func() bool { return f.workerInfo(2)["engine_source"] == "vllm" && !f.r.Registry.Snapshot().Has(1) },
		5*time.Second, 10*time.Millisecond, "read: worker 1 sleeps, out of rotation")
	assert.Equal(t, true, f.workerInfo(1)["asleep"])
	assert.Equal(t, "0", metric(t, f, "fastroute_engine_workers_without_reading"))
	for range 4 {
		assert.Equal(t, "2", f.servedBy("/v1/chat/completions", chatBody))
	}

	next.Telemetry.Engine.Enabled = false
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"telemetry.engine.enabled=false (the workers' readings withdrawn)"}, applied)
	assert.Empty(t, needRestart)
	assert.True(t, f.r.Registry.Snapshot().Has(1), "back in rotation at once")
	for _, id := range []uint64{1, 2} {
		info := f.workerInfo(id)
		assert.Nil(t, info["engine_source"], "worker %d: no reading", id)
		assert.Equal(t, false, info["asleep"], "worker %d", id)
	}
	assert.Empty(t, metric(t, f, "fastroute_engine_workers_without_reading"))
	assert.False(t, f.r.CurrentConfig().Telemetry.Engine.Enabled)
	time.Sleep(100 * time.Millisecond)
	w2, _ := f.r.Registry.Get(2)
	assert.Nil(t, w2.Engine(), "no reading published after the withdrawal")
	assert.True(t, f.r.Registry.Snapshot().Has(1), "still in rotation")
	f.assertIdle()
}
