package router

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// unavailable answers a 503 with a body, as an engine that is overloaded.
func unavailable(c net.Conn, _ *http.Request) {
	_, _ = io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
}

// hangUp closes the connection on the request, with no answer.
func hangUp(c net.Conn, _ *http.Request) { _ = c.Close() }

// Each worker's answers and failures are counted on it, by status class and
// by reason, as the router met them: answers of a good and of an
// overloaded worker, a worker that refuses connections (connect), one that
// hangs up on the request (transport), one that never answers (timeout),
// one whose stream goes silent (cut), and the first-byte time of each
// answer. A client that leaves is no failure of its worker. The page
// parses with Prometheus' own parser.
func TestEachWorkersAnswersAndFailuresAreCounted(t *testing.T) {
	busy := startFaultServer(t, unavailable)
	hanging := startFaultServer(t, hangUp)
	silent := startFaultServer(t, stall)
	stalling := startFaultServer(t, stallMidStream)
	f := startFleet(t, mocks(1, 2, 0), func(c *config.Config) {
		c.Health.Interval, c.Health.EjectAfter = time.Hour, 0
		// The client that leaves does so well before the first-byte timeout.
		c.Limits.FirstByteTimeout, c.Limits.StreamIdleTimeout = 600*time.Millisecond, 200*time.Millisecond
		for id, addr := range map[uint64]string{2: busy.addr(), 3: deadAddr(t), 4: hanging.addr(), 5: silent.addr(), 6: stalling.addr()} {
			c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: id, URL: "http://" + addr})
		}
	})
	sample := func(family, worker, label, value string) string {
		return metric(t, f, family+`{worker="`+worker+`",`+label+`="`+value+`"}`)
	}
	// Nothing sent yet: every worker's series are there, at zero.
	assert.Equal(t, "0", sample("fastroute_worker_answers_total", "6", "code", "2xx"))
	assert.Equal(t, "0", metric(t, f, `fastroute_worker_first_byte_seconds_count{worker="6"}`))

	send := func(worker, body string) (int, string) {
		resp := f.post("/v1/chat/completions", body, "x-worker-id", worker)
		text := readAll(t, resp)
		return resp.StatusCode, text
	}
	for range 3 {
		code, _ := send("1", chatBody)
		assert.Equal(t, http.StatusOK, code)
	}
	code, _ := send("1", streamBody)
	assert.Equal(t, http.StatusOK, code)
	code, _ = send("2", chatBody)
	assert.Equal(t, http.StatusServiceUnavailable, code, "the worker's own answer passes")
	code, _ = send("3", chatBody)
	assert.Equal(t, http.StatusBadGateway, code)
	code, _ = send("4", chatBody)
	assert.Equal(t, http.StatusBadGateway, code)
	code, _ = send("5", chatBody)
	assert.Equal(t, http.StatusGatewayTimeout, code)
	code, text := send("6", streamBody)
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, text, "limits.stream_idle_timeout")

	// A client that leaves while its worker works: cancelled, not the worker's failure.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.r.Addr()+"/v1/chat/completions", strings.NewReader(chatBody))
	require.NoError(t, err)
	req.Header.Set("x-worker-id", "5")
	_, err = f.client.Do(req)
	cancel()
	require.Error(t, err)
	require.Eventually(t, func() bool { return f.r.Frontend.Metrics().Requests("/v1/chat/completions", "cancelled") == 1 }, 2*time.Second, 5*time.Millisecond)
	f.assertIdle()

	want := map[string][2]string{ // worker: answers of 2xx, 5xx
		"1": {"4", "0"}, "2": {"0", "1"}, "3": {"0", "0"}, "4": {"0", "0"}, "5": {"0", "0"}, "6": {"1", "0"},
	}
	failures := map[string]string{"3": "connect", "4": "transport", "5": "timeout", "6": "cut"}
	for worker, n := range want {
		assert.Equal(t, n[0], sample("fastroute_worker_answers_total", worker, "code", "2xx"), "worker %s", worker)
		assert.Equal(t, n[1], sample("fastroute_worker_answers_total", worker, "code", "5xx"), "worker %s", worker)
		assert.Equal(t, "0", sample("fastroute_worker_answers_total", worker, "code", "4xx"), "worker %s", worker)
		for _, reason := range []string{"connect", "transport", "timeout", "cut"} {
			want := "0"
			if failures[worker] == reason {
				want = "1"
			}
			assert.Equal(t, want, sample("fastroute_worker_failures_total", worker, "reason", reason), "worker %s, %s", worker, reason)
		}
	}
	assert.Equal(t, "4", metric(t, f, `fastroute_worker_first_byte_seconds_count{worker="1"}`))
	assert.Equal(t, "0", metric(t, f, `fastroute_worker_first_byte_seconds_count{worker="5"}`), "no head came")

	_, page := adminDo(t, f, "GET", "/metrics", "", "")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(page))
	require.NoError(t, err)
	assert.Len(t, fams["fastroute_worker_first_byte_seconds"].GetMetric(), 6, "one histogram per worker")
	for _, name := range []string{"fastroute_worker_connections", "fastroute_worker_connects_total", "fastroute_worker_closed_connections_total"} {
		assert.Len(t, fams[name].GetMetric(), 6, "%s: a sample per worker", name)
	}
	assert.NotEqual(t, "0", metric(t, f, `fastroute_worker_connects_total{worker="1"}`), "its answers came on connections it opened")
	assert.Equal(t, "0", metric(t, f, `fastroute_worker_connects_total{worker="3"}`), "its connects failed")
	for _, name := range []string{"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "go_goroutines", "fastroute_build_info"} {
		assert.Contains(t, fams, name)
	}
}
