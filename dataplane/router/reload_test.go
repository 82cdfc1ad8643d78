package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReloadAppliesWorkersAndModeWithoutTouchingStreams(t *testing.T) {
	var logs syncBuffer
	f := startFleetLog(t, mocks(2, 20, 25*time.Millisecond), func(c *config.Config) { c.AdminToken = "s3cret" }, &logs)
	extra, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 3})
	require.NoError(t, err)
	t.Cleanup(func() { extra.Close() })

	next := f.r.CurrentConfig()
	source := func() (config.Config, error) { return next, nil }
	f.r.SetConfigSource(source)

	stream := f.post("/v1/chat/completions", streamBody, "x-worker-id", "1") // 0.5 s of stream on worker 1
	onTwo := f.post("/v1/chat/completions", streamBody, "x-worker-id", "2")

	// Worker 1 removed, worker 2 changed, worker 3 added; a new mode and retries; a limit that needs a restart.
	next.Workers = []dataplane.WorkerSpec{
		{ID: 2, URL: f.mocks[1].URL(), Capacity: 2},
		{ID: 3, URL: extra.URL()},
	}
	next.Router.Mode, next.Router.Retries = pickers.ModeLeastLoaded, 1
	next.Limits.MaxBodyBytes = 1 << 20
	next.Router.Queue.Size, next.Router.RetryStatuses = 8, []int{503}
	next.Router.PrefixAffinity.Enabled = true
	next.ShutdownDelay, next.PIDFile = 5*time.Second, "/run/fastroute.pid"
	code, body := adminDo(t, f, "POST", "/config/reload", "", "s3cret")
	require.Equal(t, http.StatusOK, code, body)
	var answer struct{ Applied, NeedRestart []string }
	require.NoError(t, json.Unmarshal([]byte(strings.ReplaceAll(body, "need_restart", "NeedRestart")), &answer))
	assert.Equal(t, []string{"router.mode=least-loaded router.busy_threshold=64 router.cpu_ratio=8", "router.retries=1",
		"shutdown_delay=5s", "worker 1 removed (draining)", "worker 2 replaced", "worker 3 added"}, answer.Applied)
	assert.Equal(t, []string{"limits", "pid_file", "router.prefix_affinity", "router.queue", "router.retry_statuses"}, answer.NeedRestart)
	assert.Equal(t, 5*time.Second, f.r.CurrentConfig().ShutdownDelay)
	assert.Contains(t, logs.String(), `msg="config reloaded"`)
	_, two := adminDo(t, f, "GET", "/workers/2", "", "s3cret")
	assert.Contains(t, two, `"occupancy":1,`, "replaced at its URL, worker 2 still counts the stream on its engine")
	assert.Contains(t, readAll(t, onTwo), "data: [DONE]")
	_, two = adminDo(t, f, "GET", "/workers/2", "", "s3cret")
	assert.Contains(t, two, `"occupancy":0,`)

	seen := map[string]int{}
	for i := 0; i < 20; i++ {
		resp := f.post("/v1/chat/completions", chatBody)
		readAll(t, resp)
		seen[resp.Header.Get("x-fastroute-worker")]++
	}
	assert.Zero(t, seen["1"], "the removed worker takes no new request")
	assert.Positive(t, seen["2"])
	assert.Positive(t, seen["3"])
	w2, _ := f.r.Registry.Get(2)
	assert.Equal(t, 2.0, w2.Spec().Capacity)
	assert.Equal(t, pickers.ModeLeastLoaded, f.r.CurrentConfig().Router.Mode)
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "s3cret")
	assert.Contains(t, metrics, `mode="least-loaded"`, "the metrics name the mode running now")
	assert.Equal(t, config.Size(16<<20), f.r.CurrentConfig().Limits.MaxBodyBytes, "a key that needs a restart keeps its value")
	code, running := adminDo(t, f, "GET", "/config", "", "s3cret")
	require.Equal(t, http.StatusOK, code, running)
	assert.Contains(t, running, "mode: least-loaded", "GET /config shows what runs: the applied keys new")
	assert.Contains(t, running, "max_body_bytes: 16777216", "and the keys that need a restart as they were")
	assert.Contains(t, running, "admin_token: <redacted>")
	assert.NotContains(t, running, "s3cret")
	code, _ = adminDo(t, f, "GET", "/config", "", "")
	assert.Equal(t, http.StatusUnauthorized, code, "behind the admin token as every admin route")

	full := readAll(t, stream)
	assert.Contains(t, full, "data: [DONE]", "the stream in flight on the removed worker finished")
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(1); return !ok }, 5*time.Second, 20*time.Millisecond)
	f.assertIdle()
}

func TestReloadRefusesABadConfigAndKeepsServing(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), nil)
	bad := f.r.CurrentConfig()
	bad.Router.Mode = "fastest"
	_, _, err := f.r.Reload(bad)
	assert.ErrorContains(t, err, "key router.mode: unknown mode \"fastest\"", "the same error as at start")
	bad = f.r.CurrentConfig()
	bad.Workers = append(bad.Workers, dataplane.WorkerSpec{ID: 9, URL: "http://h:1/v1"})
	_, _, err = f.r.Reload(bad)
	assert.ErrorContains(t, err, "key workers[1].url")
	assert.Equal(t, 1, f.r.Registry.Snapshot().Len(), "nothing changed")

	f.r.SetConfigSource(func() (config.Config, error) { return config.Load("/nonexistent/fastroute.yaml") })
	code, body := adminDo(t, f, "POST", "/config/reload", "", "")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "config reload refused, the running config stays: config /nonexistent/fastroute.yaml")
	resp := f.post("/v1/chat/completions", chatBody)
	readAll(t, resp)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "still serving")
}

// A reload applies prefix affinity's slack, and its peers while the
// replica shares; its other keys, or peers on a replica that was started
// without sharing, wait for a restart and change nothing.
func TestReloadAppliesThePrefixSlackAndPeers(t *testing.T) {
	gone := freeAdminAddrs(t, 3)
	f := startFleet(t, cachingEngines(2), func(c *config.Config) {
		prefixAffinity(true)(c)
		c.Router.PrefixAffinity.Peers = []string{"http://" + gone[0]}
	})
	next := f.r.CurrentConfig()
	next.Router.PrefixAffinity.Slack = 1
	next.Router.PrefixAffinity.Peers = []string{"http://" + gone[1], "http://" + gone[2]}
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.prefix_affinity.slack=1", fmt.Sprintf("router.prefix_affinity.peers=[http://%s http://%s]", gone[1], gone[2])}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, int64(1), f.r.Selector.Routing().PrefixSlack)
	assert.Equal(t, []string{"http://" + gone[1], "http://" + gone[2]}, f.r.PrefixShare.Peers())
	assert.Equal(t, next.Router.PrefixAffinity, f.r.CurrentConfig().Router.PrefixAffinity)

	again := next
	again.Router.PrefixAffinity.Slack = 7
	again.Router.PrefixAffinity.TableSize = 1 << 10
	applied, needRestart, err = f.r.Reload(again)
	require.NoError(t, err)
	assert.Empty(t, applied)
	assert.Equal(t, []string{"router.prefix_affinity"}, needRestart)
	assert.Equal(t, int64(1), f.r.Selector.Routing().PrefixSlack, "nothing of the key applies while part of it needs a restart")

	alone := startFleet(t, cachingEngines(1), prefixAffinity(true))
	next = alone.r.CurrentConfig()
	next.Router.PrefixAffinity.Peers = []string{"http://" + gone[0]}
	applied, needRestart, err = alone.r.Reload(next)
	require.NoError(t, err)
	assert.Empty(t, applied)
	assert.Equal(t, []string{"router.prefix_affinity"}, needRestart, "started without sharing: peers need a restart")
	assert.Nil(t, alone.r.PrefixShare)
}
