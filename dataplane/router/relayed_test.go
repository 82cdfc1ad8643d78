package router

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/pickers"
	"github.com/fastroute/fastroute/telemetry/engine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An engine that gives no metrics (SGLang without --enable-metrics,
// llama-server without --metrics, Ollama) is read by the router itself:
// its requests in flight and the tokens relayed from it, streamed or not,
// from which its speed is learned. So a slow one is priced as slow, and
// load-aware keeps to the fast engine while least-loaded, counting
// requests, would send the next request to the idle slow one.
func TestAnEngineWithoutMetricsIsReadByTheRouter(t *testing.T) {
	fast := mockworker.Options{ID: 1, Engine: mockworker.EngineOptions{MaxNumSeqs: 4, InterTokenLatency: 2 * time.Millisecond}}
	slow := mockworker.Options{ID: 2, NoMetrics: true,
		Engine: mockworker.EngineOptions{MaxNumSeqs: 4, InterTokenLatency: 2 * time.Millisecond, Speed: 1.0 / 8}}
	f := startFleet(t, []mockworker.Options{fast, slow}, func(c *config.Config) { c.Router.Mode = pickers.ModeLoadAware })
	w1, _ := f.r.Registry.Get(1)
	w2, _ := f.r.Registry.Get(2)
	require.Eventually(t, func() bool { st := w2.Engine(); return st != nil && st.Dialect == engine.DialectRouter }, 5*time.Second, 10*time.Millisecond)
	info := f.workerInfo(2)
	assert.Equal(t, engine.DialectRouter, info["engine_source"])
	assert.Contains(t, info["engine_reason"], "status 404")
	assert.Equal(t, "vllm", f.workerInfo(1)["engine_source"])

	// The tokens of a whole answer (its usage) and of a stream (its events).
	before := w2.Relayed().Tokens
	resp, body := f.send(http.MethodPost, "/v1/chat/completions", `{"model":"mock-model","max_tokens":5,"messages":[]}`, "x-worker-id", "2")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp, body = f.send(http.MethodPost, "/v1/completions", `{"model":"mock-model","max_tokens":6,"stream":true,"prompt":"hi"}`, "x-worker-id", "2")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	after := w2.Relayed().Tokens
	assert.EqualValues(t, 11, after-before)
	// The stream's gaps between tokens, as the router relayed them, give
	// the slow engine's speed from the next reading on (about 60 tokens
	// a second a request: a 16 ms step), a second before one is learned.
	counts := w2.Relayed()
	gaps, spanned := counts.Gaps, counts.Spanned
	// Six tokens, five gaps; fewer where tokens came in one read with the
	// first (the gaps within the first read are not timed).
	assert.True(t, gaps >= 3 && gaps <= 5, "%d gaps", gaps)
	assert.Greater(t, spanned, time.Duration(gaps)*12*time.Millisecond, "at least a step (16 ms) a gap, less slack")
	require.Eventually(t, func() bool { st := w2.Engine(); return st != nil && st.RateFromGaps }, 5*time.Second, 5*time.Millisecond)
	assert.InDelta(t, 55, w2.Engine().TokenRate, 25, "the speed of its relayed gaps")
	assert.Equal(t, strconv.FormatUint(after, 10), metric(t, f, `fastroute_worker_relayed_tokens_total{worker="2"}`))
	assert.Empty(t, metric(t, f, `fastroute_worker_relayed_tokens_total{worker="1"}`), "read from its engine's metrics")

	// Both engines busy for a while: their speeds are learned, the slow
	// one's from what the router relayed.
	var wg sync.WaitGroup
	deadline := time.Now().Add(1200 * time.Millisecond)
	for _, id := range []string{"1", "1", "2", "2"} {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				resp, body := f.send(http.MethodPost, "/v1/chat/completions", `{"model":"mock-model","max_tokens":20,"stream":true,"messages":[]}`, "x-worker-id", id)
				assert.Equal(t, http.StatusOK, resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		s1, s2 := w1.Engine(), w2.Engine()
		return s1 != nil && s2 != nil && s1.TokenRate > 0 && s2.TokenRate > 0
	}, 5*time.Second, 10*time.Millisecond, "both speeds learned")
	s1, s2 := w1.Engine(), w2.Engine()
	assert.Less(t, s2.TokenRate, s1.TokenRate/3, "the slow engine's speed, learned from the tokens relayed")
	assert.GreaterOrEqual(t, s2.Slots, s1.Slots, "priced for at least the other engine's batch")
	assert.Equal(t, s2.Slots, f.workerInfo(2)["engine_slots"], "GET /workers shows the batch it is priced for")
	tokens := w1.Relayed().Tokens
	assert.Zero(t, tokens, "an engine that gives metrics is read from them")

	// Two requests held on the fast engine: it is still the cheaper, where
	// least-loaded would take the idle slow one.
	release := holdOnFast(t, f, w1, 2)
	require.NoError(t, f.r.Selector.SetPolicy(pickers.ModeLeastLoaded, 0, 0))
	resp, body = f.send(http.MethodPost, "/v1/chat/completions", chatBody, "x-query-instance-id", "true")
	assert.JSONEq(t, `{"worker_id":2,"dp_rank":0}`, body, fmt.Sprintf("least-loaded counts requests: status %d", resp.StatusCode))
	release()
	f.assertIdle()
}

// holdOnFast holds n streams on fast (worker 1) until release, and asserts
// that it stays the pick of five queries while they run.
func holdOnFast(t *testing.T, f *fleet, fast *dataplane.Worker, n int) (release func()) {
	t.Helper()
	held := make([]*http.Response, n)
	for i := range held {
		held[i] = f.post("/v1/chat/completions", `{"model":"mock-model","max_tokens":5000,"stream":true,"messages":[]}`, "x-worker-id", "1")
		require.Equal(t, http.StatusOK, held[i].StatusCode)
	}
	require.Eventually(t, func() bool { st := fast.Engine(); return st != nil && st.Running == float64(n) }, 5*time.Second, 5*time.Millisecond)
	for range 5 {
		resp, body := f.send(http.MethodPost, "/v1/chat/completions", chatBody, "x-query-instance-id", "true")
		assert.JSONEq(t, `{"worker_id":1,"dp_rank":0}`, body, "still the cheaper: status %d", resp.StatusCode)
	}
	return func() {
		for _, r := range held {
			r.Body.Close()
		}
	}
}

// A router started beside engines that served before (a restart, a new
// replica) reads them before it serves (Scraper.Prime) and prices them
// from that first reading, from the gaps between tokens their inter-token
// latency histograms report, before it learned a speed of its own: a slow engine stays dear while idle, where without
// those the default mode fell back to counting requests (and, once the
// fast engine's speed was learned, priced the idle slow one as fast).
func TestARouterStartedBesideEnginesThatServedPricesThemAtOnce(t *testing.T) {
	fast := mockworker.Options{ID: 1, Engine: mockworker.EngineOptions{MaxNumSeqs: 4, InterTokenLatency: 2 * time.Millisecond}}
	slow := mockworker.Options{ID: 2, Engine: mockworker.EngineOptions{MaxNumSeqs: 4, InterTokenLatency: 2 * time.Millisecond, Speed: 1.0 / 8}}
	f := startFleet(t, []mockworker.Options{fast, slow}, func(c *config.Config) {
		c.Router.Mode = pickers.ModeWeighted
		for _, w := range c.Workers { // their history, before the router
			resp, err := http.Post(w.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"mock-model","prompt":"hi","max_tokens":20}`))
			require.NoError(t, err)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	w1, _ := f.r.Registry.Get(1)
	w2, _ := f.r.Registry.Get(2)
	s1, s2 := w1.Engine(), w2.Engine()
	require.True(t, s1 != nil && s2 != nil, "read before the router served its first request")
	require.True(t, s2.RateFromGaps, "%+v", s2)
	assert.Less(t, s2.TokenRate, s1.TokenRate/3, "the slow engine's own gaps")
	assert.Equal(t, "inter-token latency", f.workerInfo(2)["engine_token_rate_source"])

	// Three streams held on the fast engine: it is still the cheaper.
	holdOnFast(t, f, w1, 3)()
	f.assertIdle()
}
