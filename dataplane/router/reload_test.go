package router

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/http/frontend"
	"github.com/fastroute/fastroute/internal/loopback"
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

	// Worker 1 removed, worker 2 changed, worker 3 added; a new mode and retries; keys that need a restart.
	next.Workers = []dataplane.WorkerSpec{
		{ID: 2, URL: f.mocks[1].URL(), Capacity: 2},
		{ID: 3, URL: extra.URL()},
	}
	next.Router.Mode, next.Router.Retries = pickers.ModeLeastLoaded, 1
	next.Limits.MaxBodyBytes = 1 << 20
	next.Router.Queue.Size, next.Router.RetryStatuses = 8, []int{503}
	next.Listen = "127.0.0.1:1"
	next.ShutdownDelay = 5 * time.Second
	code, body := adminDo(t, f, "POST", "/config/reload", "", "s3cret")
	require.Equal(t, http.StatusOK, code, body)
	var answer struct{ Applied, NeedRestart []string }
	require.NoError(t, json.Unmarshal([]byte(strings.ReplaceAll(body, "need_restart", "NeedRestart")), &answer))
	assert.Equal(t, []string{"router.mode=least-loaded router.busy_threshold=64 router.cpu_ratio=8", "router.retries=1",
		"router.retry_statuses=[503]", "limits.max_body_bytes=1048576", "router.queue.size=8 router.queue.timeout=30s", "shutdown_delay=5s", "worker 1 removed (draining)",
		"worker 2 replaced", "worker 3 added"}, answer.Applied)
	assert.Equal(t, []string{"listen"}, answer.NeedRestart)
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
	assert.NotEqual(t, "127.0.0.1:1", f.r.CurrentConfig().Listen, "a key that needs a restart keeps its value")
	code, running := adminDo(t, f, "GET", "/config", "", "s3cret")
	require.Equal(t, http.StatusOK, code, running)
	assert.Contains(t, running, "mode: least-loaded", "GET /config shows what runs: the applied keys new")
	assert.Contains(t, running, "max_body_bytes: 1048576")
	assert.NotContains(t, running, "listen: 127.0.0.1:1\n", "and the keys that need a restart as they were")
	assert.Contains(t, running, "admin_token: <redacted>")
	assert.NotContains(t, running, "s3cret")
	code, _ = adminDo(t, f, "GET", "/config", "", "")
	assert.Equal(t, http.StatusUnauthorized, code, "behind the admin token as every admin route")

	full := readAll(t, stream)
	assert.Contains(t, full, "data: [DONE]", "the stream in flight on the removed worker finished")
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(1); return !ok }, 5*time.Second, 20*time.Millisecond)
	f.assertIdle()
}

// The scrape counts the reloads from the source by result, says whether
// the last one applied and when the running config was loaded, and names
// the keys the last applied reload held back for a restart until one
// applies them all.
func TestTheReloadsShowInTheMetrics(t *testing.T) {
	f := startFleet(t, mocks(1, 3, 0), nil)
	next, refuse := f.r.CurrentConfig(), error(nil)
	f.r.SetConfigSource(func() (config.Config, error) { return next, refuse })
	reload := func() int {
		t.Helper()
		code, body := adminDo(t, f, "POST", "/config/reload", "", "")
		if code != http.StatusOK {
			assert.Contains(t, body, "refused")
		}
		return code
	}
	loaded := func() float64 {
		t.Helper()
		v, err := strconv.ParseFloat(metric(t, f, "fastroute_config_last_reload_success_timestamp_seconds"), 64)
		require.NoError(t, err)
		return v
	}
	assert.Equal(t, "0", metric(t, f, `fastroute_config_reloads_total{result="applied"}`))
	assert.Equal(t, "1", metric(t, f, "fastroute_config_last_reload_successful"), "none tried yet")
	started := loaded()
	assert.InDelta(t, float64(time.Now().Unix()), started, 30, "loaded at the start")

	next.Listen, next.AdminListen, next.Router.Retries = "127.0.0.1:1", "127.0.0.1:2", 2
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, http.StatusOK, reload())
	assert.Equal(t, "1", metric(t, f, `fastroute_config_reloads_total{result="applied"}`))
	assert.Equal(t, "1", metric(t, f, `fastroute_config_need_restart{key="listen"}`))
	assert.Equal(t, "1", metric(t, f, `fastroute_config_need_restart{key="admin_listen"}`))
	applied := loaded()
	assert.Greater(t, applied, started)

	for _, bad := range []func(){
		func() { refuse = errors.New("config file: yaml: line 3: did not find expected key") },
		func() { refuse, next.Router.Retries = nil, -1 },
	} {
		bad()
		assert.Equal(t, http.StatusBadRequest, reload())
		assert.Equal(t, "0", metric(t, f, "fastroute_config_last_reload_successful"))
	}
	assert.Equal(t, "2", metric(t, f, `fastroute_config_reloads_total{result="refused"}`))
	assert.Equal(t, "1", metric(t, f, `fastroute_config_need_restart{key="listen"}`), "a refused reload changes nothing")
	assert.Equal(t, applied, loaded())

	next = f.r.CurrentConfig() // the keys held back as they run: nothing to restart for
	require.Equal(t, http.StatusOK, reload())
	assert.Equal(t, "1", metric(t, f, "fastroute_config_last_reload_successful"))
	assert.Equal(t, "2", metric(t, f, `fastroute_config_reloads_total{result="applied"}`))
	assert.Empty(t, metric(t, f, `fastroute_config_need_restart{key="listen"}`))
	assert.Empty(t, metric(t, f, `fastroute_config_need_restart{key="admin_listen"}`))
}

// A reload moves pid_file: this process's id goes to the new file, and
// the old one is removed while it holds that id (one another process
// wrote, as an upgrade's new one, stays); a file the router cannot write
// refuses the reload; turned off, the file goes.
func TestAReloadMovesThePIDFile(t *testing.T) {
	dir := t.TempDir()
	first, moved := filepath.Join(dir, "first.pid"), filepath.Join(dir, "moved.pid")
	f := startFleet(t, mocks(1, 3, 0), func(c *config.Config) { c.PIDFile = first })
	self := strconv.Itoa(os.Getpid())
	require.NoError(t, os.WriteFile(first, []byte(self+"\n"), 0o644)) // as the start's Ready wrote it
	reload := func(path string) ([]string, error) { return f.reloaded(func(c *config.Config) { c.PIDFile = path }) }
	held := func(path string) string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		return string(b)
	}

	applied, err := reload(moved)
	require.NoError(t, err)
	assert.Equal(t, []string{"pid_file=" + moved}, applied)
	assert.Equal(t, self, held(moved))
	assert.NoFileExists(t, first, "the old file, ours, goes")

	_, err = reload(filepath.Join(dir, "missing", "fastroute.pid"))
	assert.ErrorContains(t, err, "key pid_file")
	assert.Equal(t, moved, f.r.CurrentConfig().PIDFile, "refused: nothing changed")
	assert.Equal(t, self, held(moved))

	require.NoError(t, os.WriteFile(moved, []byte("4242"), 0o644)) // an upgrade's new process wrote its own
	_, err = reload(first)
	require.NoError(t, err)
	assert.Equal(t, self, held(first))
	assert.Equal(t, "4242", held(moved), "another process's file stays")

	applied, err = reload("")
	require.NoError(t, err)
	assert.Equal(t, []string{"pid_file="}, applied)
	assert.NoFileExists(t, first, "turned off, the file goes")
}

// A reload applies the limits of each exchange with a worker and the
// requests a client connection carries from the next request on, the most
// connections open at once from the next accept, and a client connection's
// own bounds to the connections accepted from then on.
func TestAReloadAppliesTheLimitsOfAnExchange(t *testing.T) {
	stalled := startFaultServer(t, stall)
	serving, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 2})
	require.NoError(t, err)
	t.Cleanup(func() { serving.Close() })
	f := startFleet(t, nil, func(c *config.Config) {
		c.Health.Interval = time.Hour
		c.Limits.FirstByteTimeout = 300 * time.Millisecond
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://" + stalled.addr()}, {ID: 2, URL: serving.URL()}}
	})
	waited := func() time.Duration {
		start := time.Now()
		resp := f.post("/v1/chat/completions", chatBody, "x-worker-id", "1")
		body := readAll(t, resp)
		require.Equal(t, http.StatusGatewayTimeout, resp.StatusCode, body)
		return time.Since(start)
	}
	closes := func() bool {
		resp := f.post("/v1/chat/completions", chatBody, "x-worker-id", "2")
		body := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		return resp.Close
	}
	assert.Less(t, waited(), 1200*time.Millisecond)
	assert.False(t, closes(), "no limit on a connection's requests")

	cfg := f.r.CurrentConfig()
	cfg.Limits.FirstByteTimeout, cfg.Limits.MaxRequestsPerConnection = 1200*time.Millisecond, 1
	applied, needRestart, err := f.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"limits.first_byte_timeout=1.2s", "limits.max_requests_per_connection=1"}, applied)
	assert.Empty(t, needRestart)
	assert.GreaterOrEqual(t, waited(), 1200*time.Millisecond, "the new first_byte_timeout")
	assert.True(t, closes(), "the answer closes a connection that carried its one request")

	// A client connection's own bounds apply to the connections accepted
	// from then on: a body over the new max_body_bytes on a new one is a
	// 413 that names it.
	over := `{"model":"mock-model","messages":[{"role":"user","content":"` + strings.Repeat("a", 2000) + `"}]}`
	assert.Contains(t, f.sendOnNewConnection(over, "x-worker-id: 2"), "200 OK")
	bounded := cfg
	bounded.Limits.MaxBodyBytes, bounded.Limits.ReadTimeout = 1<<10, 20*time.Second
	applied, needRestart, err = f.r.Reload(bounded)
	require.NoError(t, err)
	assert.Equal(t, []string{"limits.max_body_bytes=1024", "limits.read_timeout=20s"}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, bounded.Limits, f.r.CurrentConfig().Limits)
	refused := f.sendOnNewConnection(over, "x-worker-id: 2")
	assert.Contains(t, refused, "413 Request Entity Too Large")
	assert.Contains(t, refused, "limits.max_body_bytes (1024 bytes)")

	// The most client connections open at once apply from the next accept
	// (the gate's own test has connections wait and come in by them).
	held := bounded
	held.Limits.MaxConnections = 5
	applied, needRestart, err = f.r.Reload(held)
	require.NoError(t, err)
	assert.Equal(t, []string{"limits.max_connections=5"}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, "5", metric(t, f, "fastroute_client_connections_max"))
	held.Limits.MaxConnections = 0
	applied, _, err = f.r.Reload(held)
	require.NoError(t, err)
	assert.Equal(t, []string{fmt.Sprintf("limits.max_connections=%d", frontend.DefaultMaxConnections())}, applied, "0: the default")
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
	next.Router.PrefixAffinity.ShareInterval = 5 * time.Millisecond
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.prefix_affinity.slack=1", fmt.Sprintf("router.prefix_affinity.peers=[http://%s http://%s]", gone[1], gone[2]),
		"router.prefix_affinity.share_interval=5ms"}, applied)
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

// A reload applies new secrets (read from their files again) and a new
// access log setting to the next request, and never says the secrets.
func TestAReloadRotatesTheSecretsAndTheAccessLog(t *testing.T) {
	const oldEngineKey, newEngineKey = "sk-engine-old-5f1c", "sk-engine-new-9a2e"
	dir := t.TempDir()
	adminFile, engineFile := filepath.Join(dir, "admin-token"), filepath.Join(dir, "engine-key")
	require.NoError(t, os.WriteFile(adminFile, []byte("admin-old-77\n"), 0o600))
	require.NoError(t, os.WriteFile(engineFile, []byte(oldEngineKey+"\n"), 0o600))
	opts := mocks(2, 4, 20*time.Millisecond) // worker 1 takes the old engine key, worker 2 the new one
	opts[0].APIKey, opts[1].APIKey = oldEngineKey, newEngineKey
	var logs syncBuffer
	f := startFleetLog(t, opts, func(c *config.Config) {
		c.AdminTokenFile, c.WorkerAPIKeyFile = adminFile, engineFile
		c.APIKeysFile = keysFile(t, "team-a "+teamAKey)
	}, &logs)
	source := func() (config.Config, error) { // as the file and flags read again: the secrets' files, not their values
		c := f.r.CurrentConfig()
		c.AdminToken, c.WorkerAPIKey = "", ""
		return c, nil
	}
	f.r.SetConfigSource(source)
	ask := func(worker string) int {
		resp, body := f.send("POST", "/v1/chat/completions", chatBody, "Authorization", "Bearer "+teamAKey, "x-worker-id", worker)
		if resp.StatusCode == http.StatusOK {
			assert.Contains(t, body, `"choices"`)
		}
		return resp.StatusCode
	}
	listed := func(id uint64) bool {
		w, ok := f.r.Registry.Get(id)
		return ok && len(w.Advertised().Models) > 0
	}
	require.Eventually(t, func() bool { return listed(1) }, 5*time.Second, 10*time.Millisecond, "worker 1 lists its models to the old key")
	assert.Equal(t, http.StatusOK, ask("1"))
	assert.Equal(t, http.StatusUnauthorized, ask("2"), "worker 2 takes only the new key")
	assert.False(t, listed(2), "nor lists its models to the old one")
	assert.NotContains(t, logs.String(), "log=access", "no access log yet")

	// A stream that began with the access log off ends without a line.
	stream := f.post("/v1/chat/completions", streamBody, "Authorization", "Bearer "+teamAKey, "x-worker-id", "1")
	require.Equal(t, http.StatusOK, stream.StatusCode)
	first, err := bufio.NewReader(stream.Body).ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, first, "data:")

	require.NoError(t, os.WriteFile(adminFile, []byte("admin-new-88\n"), 0o600))
	require.NoError(t, os.WriteFile(engineFile, []byte(newEngineKey+"\n"), 0o600))
	next, err := source()
	require.NoError(t, err)
	next.Log.Access = "all"
	f.r.SetConfigSource(func() (config.Config, error) { return next, nil })
	code, body := adminDo(t, f, "POST", "/config/reload", "", "admin-old-77")
	require.Equal(t, http.StatusOK, code, body)
	var answer struct{ Applied, NeedRestart []string }
	require.NoError(t, json.Unmarshal([]byte(strings.ReplaceAll(body, "need_restart", "NeedRestart")), &answer))
	assert.Equal(t, []string{"api_keys_file=\"" + f.r.CurrentConfig().APIKeysFile + "\" (1 keys)", "admin_token changed",
		"worker_api_key changed", "log.access=all"}, answer.Applied)
	assert.Empty(t, answer.NeedRestart)

	readAll(t, stream)
	code, _ = adminDo(t, f, "GET", "/workers", "", "admin-old-77")
	assert.Equal(t, http.StatusUnauthorized, code, "the old admin token is refused")
	code, _ = adminDo(t, f, "GET", "/workers", "", "admin-new-88")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, http.StatusUnauthorized, ask("1"), "worker 1 takes only the old key, which the router no longer sends")
	assert.Equal(t, http.StatusOK, ask("2"))
	require.Eventually(t, func() bool { return listed(2) }, 5*time.Second, 10*time.Millisecond, "the probes send the new key")
	assert.Regexp(t, `log=access .*path=/v1/chat/completions status=200 .* worker=2 `, logs.String(), "the access log is on")
	assert.NotRegexp(t, `log=access .*status=200 .* worker=1 `, logs.String(), "not for the stream that began before")
	code, running := adminDo(t, f, "GET", "/config", "", "admin-new-88")
	require.Equal(t, http.StatusOK, code, running)
	assert.Contains(t, running, "access: all")

	next.Log.Access = "errors"
	code, body = adminDo(t, f, "POST", "/config/reload", "", "admin-new-88")
	require.Equal(t, http.StatusOK, code, body)
	lines := strings.Count(logs.String(), "log=access")
	assert.Equal(t, http.StatusOK, ask("2"))
	assert.Equal(t, lines, strings.Count(logs.String(), "log=access"), "errors only: no line for a 200")
	assert.Equal(t, http.StatusUnauthorized, ask("1"))
	assert.Equal(t, lines+1, strings.Count(logs.String(), "log=access"), "a line for the 401")

	for _, secret := range []string{"admin-old-77", "admin-new-88", oldEngineKey, newEngineKey} {
		assert.NotContains(t, logs.String(), secret)
		assert.NotContains(t, body, secret)
		assert.NotContains(t, running, secret)
	}
	f.assertIdle()
}

// An admin listener reachable from other hosts keeps a token: a reload
// whose config has none is refused, even when it also moves admin_listen
// to loopback (which waits for a restart).
func TestAReloadKeepsTheAdminTokenOffLoopback(t *testing.T) {
	t.Setenv(config.AdminTokenEnv, "")
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.AdminListen, c.AdminToken = "0.0.0.0:0", "s3cret" })
	next := f.r.CurrentConfig()
	next.AdminToken, next.AdminListen = "", "127.0.0.1:0"
	_, _, err := f.r.Reload(next)
	require.ErrorContains(t, err, "key admin_token: the admin listener runs on 0.0.0.0:0, reachable from other hosts, and this config sets no admin token")
	code, _ := adminDo(t, f, "GET", "/workers", "", "")
	assert.Equal(t, http.StatusUnauthorized, code, "the token still holds")
	code, _ = adminDo(t, f, "GET", "/workers", "", "s3cret")
	assert.Equal(t, http.StatusOK, code)
}

// A new log.format applies through the setter the router was given
// (serve's logformat.Switch), and waits for a restart without one.
func TestAReloadAppliesTheLogFormatThroughItsSetter(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), nil)
	next := f.r.CurrentConfig()
	next.Log.Format = "json"
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Empty(t, applied)
	assert.Equal(t, []string{"log.format"}, needRestart)
	assert.Equal(t, "text", f.r.CurrentConfig().Log.Format)

	var set []string
	f.r.FormatLogsWith(func(format string) { set = append(set, format) })
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"log.format=json"}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, []string{"json"}, set)
	assert.Equal(t, "json", f.r.CurrentConfig().Log.Format)
}

// A worker a reload removed is swept once idle at the health interval the
// reload gave, not the one the router started with (an hour here).
func TestARemovedWorkerIsSweptAtTheReloadsHealthInterval(t *testing.T) {
	f := startFleet(t, mocks(2, 1, 0), func(c *config.Config) { c.Health.Interval = time.Hour })
	next := f.r.CurrentConfig()
	next.Health.Interval, next.Workers = 20*time.Millisecond, next.Workers[:1]
	applied, _, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Contains(t, applied, "worker 2 removed (draining)")
	assert.Eventually(t, func() bool { _, ok := f.r.Registry.Get(2); return !ok }, 2*time.Second, 10*time.Millisecond)
	f.assertIdle()
}

// A reload applies health's keys: a worker failing every request is
// ejected once eject_after comes down to its streak, one failing its
// probes leaves rotation once unhealthy_after does, and a new interval and
// path make the next round.
func TestAReloadAppliesHealthThresholds(t *testing.T) {
	opts := mocks(3, 1, 0)
	opts[0].FailRate = 1 // worker 1 answers every request 500
	f := startFleet(t, opts, func(c *config.Config) {
		c.Health.EjectAfter, c.Health.UnhealthyAfter = 1000, 1000
		c.Workers[2].HealthPath = "/no-such-probe" // worker 3's probes fail (404)
	})
	failOn1 := func() {
		resp := f.post("/v1/chat/completions", chatBody, "x-worker-id", "1")
		readAll(t, resp)
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	}
	w1, _ := f.r.Registry.Get(1)
	w3, _ := f.r.Registry.Get(3)
	for range 3 {
		failOn1()
	}
	time.Sleep(350 * time.Millisecond) // three probe rounds
	until, _ := w1.Ejected()
	assert.True(t, until.IsZero(), "three failures are far from eject_after 1000")
	assert.True(t, w3.Healthy(), "three failed probes are far from unhealthy_after 1000")

	next := f.r.CurrentConfig()
	next.Health.EjectAfter, next.Health.UnhealthyAfter = 4, 2
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"health.unhealthy_after=2 health.eject_after=4 health.eject_time=5s health.eject_max=5m0s"}, applied)
	assert.Empty(t, needRestart)
	failOn1()
	until, _ = w1.Ejected()
	assert.False(t, until.IsZero(), "the fourth failure in a row ejects it")
	require.Eventually(t, func() bool { return !w3.Healthy() }, 5*time.Second, 10*time.Millisecond, "the next probe takes worker 3 out")
	assert.Equal(t, 4, f.r.CurrentConfig().Health.EjectAfter)

	// The probes' interval and path apply from the next round.
	w2, _ := f.r.Registry.Get(2)
	require.True(t, w2.Healthy())
	probed := next.Health
	next.Health.Interval, next.Health.Path = 20*time.Millisecond, "/no-such-path"
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{`health.interval=20ms health.timeout=` + next.Health.Timeout.String() + ` health.path="/no-such-path"`,
		"health.unhealthy_after=2 health.eject_after=4 health.eject_time=5s health.eject_max=5m0s"}, applied)
	assert.Empty(t, needRestart)
	require.Eventually(t, func() bool { return !w2.Healthy() }, 5*time.Second, 5*time.Millisecond, "its probes at the new path fail")
	next.Health = probed
	_, _, err = f.r.Reload(next)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return w2.Healthy() }, 5*time.Second, 5*time.Millisecond, "and pass at the old one again")
	assert.Equal(t, probed, f.r.CurrentConfig().Health)
	f.assertIdle()
}

// A reload that gives a worker another URL gives it another engine, probed
// at once and on probation until then (the probes' interval here is an
// hour): moved to an address where nothing listens, its first failed probe
// takes it out of rotation (unhealthy_after is 3), and the requests go to
// the other worker, none to a connect that fails; moved on to a live
// engine, it serves once that probe passes.
func TestAWorkerMovedToAnotherURLServesOnceProbed(t *testing.T) {
	f := startFleet(t, mocks(2, 1, 0), func(c *config.Config) { c.Health.Interval = time.Hour })
	dead, err := loopback.FreeAddr()
	require.NoError(t, err)
	moveTo := func(url string) {
		t.Helper()
		applied, err := f.reloaded(func(c *config.Config) {
			c.Workers = slices.Clone(c.Workers) // the running config's own otherwise
			c.Workers[0].URL = url
		})
		require.NoError(t, err)
		assert.Equal(t, []string{"worker 1 replaced"}, applied)
	}
	moveTo("http://" + dead)
	require.Eventually(t, func() bool { return !f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond,
		"out at its first failed probe")
	for range 6 {
		resp, body := f.send("POST", "/v1/chat/completions", chatBody)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
	}
	connect, _ := workerFailures(t, f, "1")
	assert.Equal(t, "0", connect, "no request went to the address where nothing listens")

	live, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 7, Tokens: 1})
	require.NoError(t, err)
	t.Cleanup(func() { live.Close() })
	moveTo(live.URL())
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond, "probed at once")
	resp, body := f.send("POST", "/v1/chat/completions", chatBody, "x-worker-id", "1")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "7", resp.Header.Get("x-mock-worker"), "the new engine answers")
	f.assertIdle()
}
