package router

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An engine that runs requests and generates no token for
// telemetry.engine.stall_after (a hung engine whose /health still answers
// 200) leaves rotation, and comes back once it generates again: its
// requests go to the other worker meanwhile, and one naming it is refused
// saying why. Off (0) by default, where the same engine stays in until a
// reload sets the bound.
func TestAStalledEngineIsOutOfRotation(t *testing.T) {
	var running, tokens atomic.Int64
	tokens.Store(100)
	addr := scriptedEngine(t, func() string {
		return fmt.Sprintf("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %d\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"+
			"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total %d\n", running.Load(), tokens.Load())
	})

	for _, stallAfter := range []time.Duration{300 * time.Millisecond, 0} {
		running.Store(0)
		f := startFleet(t, []mockworker.Options{{ID: 2}}, func(c *config.Config) {
			c.Workers = append(c.Workers, c.Workers[0])
			c.Workers[0].ID, c.Workers[0].URL = 1, "http://"+addr
			c.Telemetry.Engine.Interval = 20 * time.Millisecond
			c.Telemetry.Engine.StallAfter = stallAfter
		})
		worker1 := func() map[string]any { return f.workerInfo(1) }
		require.Eventually(t, func() bool { return worker1()["engine_source"] == "vllm" }, 5*time.Second, 10*time.Millisecond)
		running.Store(2) // and the counter stays at 100
		if stallAfter == 0 {
			require.Eventually(t, func() bool { s, _ := worker1()["engine_still_seconds"].(float64); return s > 0.5 },
				5*time.Second, 10*time.Millisecond, "still, and timed")
			assert.Equal(t, false, worker1()["stalled"], "stall_after 0: never taken out")
			resp, body := f.send("POST", "/v1/chat/completions", chatBody, "x-worker-id", "1")
			assert.Equal(t, http.StatusOK, resp.StatusCode, body)
			next := f.r.CurrentConfig()
			next.Telemetry.Engine.StallAfter = 300 * time.Millisecond
			applied, needRestart, err := f.r.Reload(next)
			require.NoError(t, err)
			assert.Equal(t, []string{"telemetry.engine.stall_after=300ms"}, applied)
			assert.Empty(t, needRestart)
			require.Eventually(t, func() bool { return worker1()["stalled"] == true }, 5*time.Second, 10*time.Millisecond,
				"the next reading judges it by the reload's bound")
			next.Telemetry.Engine.StallAfter = time.Minute
			next.Telemetry.Engine.Interval = time.Hour // no scrape after the next tick
			applied, needRestart, err = f.r.Reload(next)
			require.NoError(t, err)
			assert.Equal(t, []string{"telemetry.engine.stall_after=1m0s",
				"telemetry.engine.interval=1h0m0s telemetry.engine.timeout=" + next.Telemetry.Engine.Timeout.String()}, applied)
			assert.Empty(t, needRestart)
			require.Eventually(t, func() bool { age, _ := worker1()["engine_age_seconds"].(float64); return age > 0.5 },
				5*time.Second, 10*time.Millisecond, "scraped every hour from now: its reading ages (at 20 ms it was never older)")
			continue
		}
		require.Eventually(t, func() bool { return worker1()["stalled"] == true }, 5*time.Second, 10*time.Millisecond,
			"GET /workers shows the engine stalled")
		// The flag is set a moment before the routing snapshot without it is
		// published.
		require.Eventually(t, func() bool { return !f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond)
		assert.GreaterOrEqual(t, worker1()["engine_still_seconds"], 0.3)
		assert.Equal(t, "1", metric(t, f, `fastroute_worker_stalled{worker="1"}`))
		for range 6 {
			assert.Equal(t, "2", f.servedBy("/v1/chat/completions", chatBody))
		}
		resp, body := f.send("POST", "/v1/chat/completions", chatBody, "x-worker-id", "1")
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
		assert.Contains(t, body, "worker 1 is not routable (stalled)")

		generating := make(chan struct{}) // it generates again, a token every 10 ms
		go func() {
			for {
				select {
				case <-generating:
					return
				case <-time.After(10 * time.Millisecond):
					tokens.Add(1)
				}
			}
		}()
		require.Eventually(t, func() bool { return worker1()["stalled"] == false }, 5*time.Second, 10*time.Millisecond,
			"back once it generates")
		require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Has(1) }, 5*time.Second, 10*time.Millisecond)
		assert.Equal(t, "0", metric(t, f, `fastroute_worker_stalled{worker="1"}`))
		resp, body = f.send("POST", "/v1/chat/completions", chatBody, "x-worker-id", "1")
		assert.Equal(t, http.StatusOK, resp.StatusCode, body)
		close(generating)
		f.assertIdle()
	}
}
