package router

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scriptedEngine serves an engine's /health, a /metrics page that page
// writes at each scrape, and chat completions answered "ok", until the
// test ends; it returns its address.
func scriptedEngine(t *testing.T, page func() string) string {
	t.Helper()
	return scriptedEngineAnswering(t, page, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)
	})
}

// scriptedEngineAnswering is scriptedEngine with chat completions answered
// by answer.
func scriptedEngineAnswering(t *testing.T, page func() string, answer http.HandlerFunc) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, page()) })
	mux.HandleFunc("POST /v1/chat/completions", answer)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	engine := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = engine.Serve(ln) }()
	t.Cleanup(func() { engine.Close() })
	return ln.Addr().String()
}

// An engine whose metrics page says NaN requests are running (the text
// format allows it) is routed on the router's own signals and GET
// /workers says why; once its page is sound again its reading is taken.
// Before, the NaN reached GET /workers, whose JSON cannot hold it: the
// handler panicked and no worker was listed.
func TestAnEngineReportingNaNIsRoutedOnTheRoutersOwnSignals(t *testing.T) {
	var running atomic.Value
	running.Store("NaN")
	addr := scriptedEngine(t, func() string {
		return fmt.Sprintf("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %s\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n", running.Load())
	})
	f := startFleet(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://" + addr}}
		c.Telemetry.Engine.Interval = 50 * time.Millisecond
	})
	workers := func() map[string]any { return f.workerInfo(1) }
	require.Eventually(t, func() bool {
		reason, _ := workers()["engine_reason"].(string)
		return strings.Contains(reason, "vllm:num_requests_running is NaN; want a count of requests")
	}, 5*time.Second, 10*time.Millisecond, "GET /workers says why the engine's reading is refused")
	assert.Equal(t, "none", workers()["engine_source"])
	resp, body := f.send("POST", "/v1/chat/completions", chatBody)
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Equal(t, "1", resp.Header.Get("x-fastroute-worker"))
	f.assertIdle()

	running.Store("2")
	require.Eventually(t, func() bool {
		w := workers()
		return w["engine_source"] == "vllm" && w["engine_running"] == 2.0
	}, 5*time.Second, 10*time.Millisecond, "a sound page's reading is taken")
	// Counted as a fallback: once here, more where a loaded machine let a
	// reading go stale (3 intervals without a scrape).
	n, err := strconv.Atoi(metric(t, f, "fastroute_engine_fallbacks_total"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, 1)
}
