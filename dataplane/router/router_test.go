package router

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/http/frontend"
	"github.com/fastroute/fastroute/internal/syncbuf"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// fleet is a router in front of real mock workers on loopback.
type fleet struct {
	t      *testing.T
	r      *Router
	mocks  []*mockworker.Worker
	client *http.Client
}

func startFleet(t *testing.T, opts []mockworker.Options, tweak func(*config.Config)) *fleet {
	t.Helper()
	return startFleetLog(t, opts, tweak, io.Discard)
}

// syncBuffer is a log destination tests read while the router writes.
type syncBuffer = syncbuf.Buffer

// startFleetLog is startFleet with the router's log written to logs.
func startFleetLog(t *testing.T, opts []mockworker.Options, tweak func(*config.Config), logs io.Writer) *fleet {
	t.Helper()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Router.Mode = pickers.ModeRoundRobin
	cfg.Health.Interval = 100 * time.Millisecond
	f := &fleet{t: t, client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 200}}}
	var started []*mockworker.Worker // f.mocks, which a test may point elsewhere
	t.Cleanup(func() { closeTogether(started) })
	for _, o := range opts {
		m, err := mockworker.Start("127.0.0.1:0", o)
		require.NoError(t, err)
		started = append(started, m)
		cfg.Workers = append(cfg.Workers, dataplane.WorkerSpec{ID: o.ID, URL: m.URL(), LoRAs: o.LoRAs})
	}
	f.mocks = started
	if tweak != nil {
		tweak(&cfg)
	}
	r, err := Start(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	require.NoError(t, err)
	t.Cleanup(func() {
		// The client's kept-alive connections first: the router's drain
		// then has none to leave time for a next request (drainLinger).
		f.client.CloseIdleConnections()
		r.Close()
	})
	f.r = r
	return f
}

// closeTogether closes mock workers at once: each Close waits at least
// one round of fasthttp's shutdown poll (100 ms) for its connections.
func closeTogether(ms []*mockworker.Worker) {
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() { m.Close() })
	}
	wg.Wait()
}

func mocks(n int, tokens int, interval time.Duration) []mockworker.Options {
	out := make([]mockworker.Options, n)
	for i := range out {
		out[i] = mockworker.Options{ID: uint64(i + 1), Tokens: tokens, TokenInterval: interval}
	}
	return out
}

func (f *fleet) post(path, body string, headers ...string) *http.Response {
	f.t.Helper()
	return f.open(http.MethodPost, path, body, headers...)
}

// open sends one request of any method with headers (name, value pairs)
// and returns its answer, the body still to read.
func (f *fleet) open(method, path, body string, headers ...string) *http.Response {
	f.t.Helper()
	req, err := http.NewRequest(method, "http://"+f.r.Addr()+path, strings.NewReader(body))
	require.NoError(f.t, err)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := f.client.Do(req)
	require.NoError(f.t, err)
	return resp
}

// send sends one request of any method with headers and returns the
// answer, its body read.
func (f *fleet) send(method, path, body string, headers ...string) (*http.Response, string) {
	f.t.Helper()
	resp := f.open(method, path, body, headers...)
	return resp, readAll(f.t, resp)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// assertIdle waits until every worker's occupancy is back to exactly zero.
func (f *fleet) assertIdle() {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		for _, w := range f.r.Registry.All() {
			if w.Occupancy() != 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, 5*time.Millisecond, "occupancy did not return to zero")
	for _, w := range f.r.Registry.All() {
		assert.Zero(f.t, w.Occupancy(), "worker %d", w.ID())
	}
}

const chatBody = `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`
const streamBody = `{"model":"mock-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`

func TestProxiesAndNamesTheWorker(t *testing.T) {
	f := startFleet(t, mocks(3, 3, 0), nil)
	seen := map[string]int{}
	for i := 0; i < 6; i++ {
		resp := f.post("/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		w := resp.Header.Get("x-fastroute-worker")
		assert.Equal(t, w, resp.Header.Get("x-mock-worker"), "header names the worker that answered")
		assert.Contains(t, body, `"worker":`+w)
		seen[w]++
	}
	assert.Equal(t, map[string]int{"1": 2, "2": 2, "3": 2}, seen, "round-robin over 3 workers")
	resp := f.post("/v1/completions", `{"model":"mock-model","prompt":"x"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, readAll(t, resp))
	resp = f.post("/v1/embeddings", `{"model":"mock-model","input":["a","b"]}`)
	assert.Contains(t, readAll(t, resp), `"index":1`)
	f.assertIdle()
}

// The body and headers reach the worker as the client sent them; with
// add_x_forwarded_for the router's peer is appended to X-Forwarded-For, a
// key a reload names as needing a restart.
func TestBodyAndHeadersReachTheWorker(t *testing.T) {
	got := make(chan []byte, 1)
	gotHeader := make(chan string, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	echo := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/v1/chat/completions" {
			return // health probes and model listings
		}
		got <- append([]byte(nil), ctx.PostBody()...)
		gotHeader <- string(ctx.Request.Header.Peek("x-custom")) + " | " + string(ctx.Request.Header.Peek("X-Forwarded-For"))
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"ok":true}`)
	}}
	go echo.Serve(ln)
	t.Cleanup(func() { echo.Shutdown() })
	worker := func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 7, URL: "http://" + ln.Addr().String()}}
	}
	f := startFleet(t, nil, worker)
	body := `{"model":"m",  "messages":[{"role":"user","content":"ünïcode \u00e9 and spaces   kept"}],"extra":{"n":[1,2,3]}}`
	resp := f.post("/v1/chat/completions", body, "x-custom", "kept", "X-Forwarded-For", "203.0.113.7")
	assert.Equal(t, `{"ok":true}`, readAll(t, resp))
	assert.Equal(t, body, string(<-got), "body bytes reach the worker unchanged")
	assert.Equal(t, "kept | 203.0.113.7", <-gotHeader)
	assert.Equal(t, "7", resp.Header.Get("x-fastroute-worker"))

	g := startFleet(t, nil, func(c *config.Config) {
		worker(c)
		c.AddXForwardedFor = true
	})
	resp = g.post("/v1/chat/completions", body, "x-custom", "kept", "X-Forwarded-For", "203.0.113.7")
	assert.Equal(t, `{"ok":true}`, readAll(t, resp))
	assert.Equal(t, body, string(<-got))
	assert.Equal(t, "kept | 203.0.113.7, 127.0.0.1", <-gotHeader, "the router's peer appended")
	cfg := g.r.CurrentConfig()
	cfg.AddXForwardedFor = false
	applied, needRestart, err := g.r.Reload(cfg)
	require.NoError(t, err)
	assert.Equal(t, []string{"add_x_forwarded_for=false"}, applied)
	assert.Empty(t, needRestart)
	resp = g.post("/v1/chat/completions", body, "x-custom", "kept", "X-Forwarded-For", "203.0.113.7")
	assert.Equal(t, `{"ok":true}`, readAll(t, resp))
	assert.Equal(t, body, string(<-got))
	assert.Equal(t, "kept | 203.0.113.7", <-gotHeader, "a reload stops the append for the next request")
	g.assertIdle()
}

func TestSSEFlushedChunkByChunk(t *testing.T) {
	f := startFleet(t, mocks(1, 5, 150*time.Millisecond), nil)
	start := time.Now()
	resp := f.post("/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	firstAfter := time.Since(start)
	assert.True(t, strings.HasPrefix(line, "data: {"), line)
	// The worker needs 5×150ms for the whole answer; the first chunk must
	// arrive while it is still streaming.
	assert.Less(t, firstAfter, 500*time.Millisecond)
	assert.EqualValues(t, 1, f.mocks[0].Active(), "worker still streaming when the first chunk arrived")
	rest, err := io.ReadAll(rd)
	require.NoError(t, err)
	assert.Equal(t, 5, strings.Count(line+string(rest), "data: {"))
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"))
	resp.Body.Close()
	f.assertIdle()
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Requests("/v1/chat/completions", "ok"))
}

func TestHundredClientsDisconnectMidStream(t *testing.T) {
	f := startFleet(t, mocks(4, 50, 20*time.Millisecond), nil)
	var wg sync.WaitGroup
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", f.r.Addr())
			if !assert.NoError(t, err) {
				return
			}
			fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(streamBody), streamBody)
			buf := make([]byte, 512)
			_, err = conn.Read(buf) // headers and the first chunk
			assert.NoError(t, err)
			conn.Close()
		}()
	}
	wg.Wait()
	f.assertIdle()
	m := f.r.Frontend.Metrics()
	assert.EqualValues(t, 100, m.Requests("/v1/chat/completions", "cancelled"))
}

// A query-only request (x-query-instance-id: true, True, 1...: the words
// strconv.ParseBool takes) is answered its pick and holds nothing.
func TestQueryOnlyHoldsNoReservation(t *testing.T) {
	f := startFleet(t, mocks(2, 1, 0), nil)
	for _, yes := range []string{"true", "True", "TRUE", "1"} {
		resp := f.post("/v1/chat/completions", chatBody, "x-query-instance-id", yes)
		assert.Regexp(t, `^\{"worker_id":[12],"dp_rank":0\}`, readAll(t, resp), yes)
	}
	assert.Zero(t, f.mocks[0].Served()+f.mocks[1].Served(), "nothing dispatched")
	resp := f.post("/v1/chat/completions", chatBody, "x-query-instance-id", "False")
	assert.NotContains(t, readAll(t, resp), "worker_id", "False dispatches")
	assert.EqualValues(t, 1, f.mocks[0].Served()+f.mocks[1].Served())
	f.assertIdle()
}

func TestDirectMode(t *testing.T) {
	f := startFleet(t, mocks(3, 1, 0), func(c *config.Config) { c.Router.Mode = pickers.ModeDirect })
	for i := 0; i < 3; i++ {
		resp := f.post("/v1/chat/completions", chatBody, "x-worker-id", "2")
		readAll(t, resp)
		assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
	}
	for _, c := range []struct {
		headers []string
		status  int
		msg     string
	}{
		{nil, 400, "x-worker-id"},
		{[]string{"x-worker-id", "9"}, 400, "unknown worker id 9"},
		{[]string{"x-worker-id", "two"}, 400, "is not a positive integer worker id"},
		{[]string{"x-worker-id", "1", "x-dp-rank", "-1"}, 400, "x-dp-rank"},
		{[]string{"x-worker-id", "1", "x-dp-rank", "4"}, 400, "dp rank 4 is outside 0..0"},
		{[]string{"x-worker-id", "1", "x-query-instance-id", "maybe"}, 400, "x-query-instance-id"},
	} {
		resp := f.post("/v1/chat/completions", chatBody, c.headers...)
		body := readAll(t, resp)
		assert.Equal(t, c.status, resp.StatusCode, body)
		assert.Contains(t, body, c.msg)
		assert.Contains(t, body, `"type":"invalid_request_error"`)
	}
	f.assertIdle()
}

func TestBadRequests(t *testing.T) {
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) { c.Limits.MaxBodyBytes = 1024 })
	for _, c := range []struct {
		path, body string
		status     int
		msg        string
	}{
		{"/v1/chat/completions", "", 400, "body is empty"},
		{"/v1/chat/completions", "{not json", 400, "not valid JSON"},
		{"/v1/chat/completions", `["array"]`, 400, "must be a JSON object"},
		{"/v1/chat/completions", `{"x":"` + strings.Repeat("a", 2000) + `"}`, 413, "max_body_bytes"},
		{"/nope", "{}", 404, "no route"}, // every POST under /v1/ is proxied; other paths are not
		// Two models: the engine's json would serve the last, the router
		// would route (and check an API key's models) by the first.
		{"/v1/chat/completions", `{"model":"mock-model","messages":[],"model":"other"}`, 400, `field \"model\" appears more than once`},
		{"/v1/completions", `{"model":"mock-model","mod\u0065l":"other","prompt":"hi"}`, 400, "appears more than once"},
	} {
		resp := f.post(c.path, c.body)
		body := readAll(t, resp)
		assert.Equal(t, c.status, resp.StatusCode, body)
		assert.Contains(t, body, c.msg)
		assert.Contains(t, body, `{"error":{"message":`)
	}
	// A compressed body, which neither the router nor the engines decode:
	// 415, saying which coding it accepts (none).
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(chatBody))
	require.NoError(t, zw.Close())
	resp, body := f.send(http.MethodPost, "/v1/chat/completions", gz.String(), "Content-Encoding", "gzip", "Content-Type", "application/json")
	assert.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode, body)
	assert.Equal(t, "identity", resp.Header.Get("Accept-Encoding"))
	assert.Contains(t, body, `request body has Content-Encoding \"gzip\": the router reads this route's JSON body and decodes no content coding`)
	resp, err := f.client.Get("http://" + f.r.Addr() + "/v1/chat/completions")
	require.NoError(t, err)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	resp.Body.Close()
	assert.Zero(t, f.mocks[0].Served())
	resp, body = f.send(http.MethodPost, "/v1/chat/completions", chatBody, "Content-Encoding", "identity")
	assert.Equal(t, http.StatusOK, resp.StatusCode, body)
	f.assertIdle()
}

func TestBusyThresholdAnswers429(t *testing.T) {
	f := startFleet(t, mocks(1, 20, 25*time.Millisecond), func(c *config.Config) { c.Router.BusyThreshold = 1 })
	hold := f.post("/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, hold.StatusCode)
	resp := f.post("/v1/chat/completions", chatBody)
	body := readAll(t, resp)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))
	assert.Contains(t, body, `"type":"resource_exhausted"`)
	readAll(t, hold)
	f.assertIdle()
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Requests("/v1/chat/completions", "resource_exhausted"))
}

func TestNoWorkersAnswers503(t *testing.T) {
	f := startFleet(t, nil, nil)
	resp := f.post("/v1/chat/completions", chatBody)
	body := readAll(t, resp)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, body, `"type":"no_endpoints"`)
	resp, err := f.client.Get("http://" + f.r.Addr() + "/health")
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	resp.Body.Close()
}

// deadAddr is an address where nothing listens. It is on 127.0.0.2, so the
// port it frees is not taken by the next 127.0.0.1:0 listener of another
// test running beside this one.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestRetryOnConnectFailure(t *testing.T) {
	dead := deadAddr(t)
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) {
		c.Health.Interval = time.Hour // keep the dead worker routable
		c.Health.EjectAfter = 0       // passive health too
		c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: 9, URL: "http://" + dead})
	})
	for i := 0; i < 10; i++ {
		resp := f.post("/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Equal(t, "1", resp.Header.Get("x-fastroute-worker"))
	}
	m := f.r.Frontend.Metrics()
	// Round-robin sends at least every other request to the dead worker first
	// (a retry's pick advances the shared cycle too).
	assert.GreaterOrEqual(t, m.Retries(), uint64(5))

	// Bound to the dead worker: no other candidate, a clear 502.
	resp := f.post("/v1/chat/completions", chatBody, "x-worker-id", "9")
	body := readAll(t, resp)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
	assert.Contains(t, body, "worker 9 failed before answering")
	f.assertIdle()
}

func TestRetriesAreBounded(t *testing.T) {
	f := startFleet(t, nil, func(c *config.Config) {
		c.Health.Interval = time.Hour
		c.Router.Retries = 2
		for id := uint64(1); id <= 5; id++ {
			c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: id, URL: "http://" + deadAddr(t)})
		}
	})
	resp := f.post("/v1/chat/completions", chatBody)
	body := readAll(t, resp)
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, body)
	assert.EqualValues(t, 2, f.r.Frontend.Metrics().Retries(), "at most `retries` moves")
	f.assertIdle()
}

func TestNoRetryAfterFirstByte(t *testing.T) {
	addr := startFaultServer(t, cutMidAnswer).addr()
	f := startFleet(t, mocks(1, 3, 0), func(c *config.Config) {
		c.Router.Mode = pickers.ModeDirect
		c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: 5, URL: "http://" + addr})
	})
	resp := f.post("/v1/chat/completions", streamBody, "x-worker-id", "5")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Error(t, err, "a stream cut mid-way reaches the client as a broken stream")
	assert.Contains(t, string(b), `"partial":1`)
	assert.Contains(t, string(b), "\n\ndata: {\"error\":{\"message\":\"worker 5 broke the stream: ", "an SSE error event says why first")
	assert.Zero(t, f.r.Frontend.Metrics().Retries())
	f.assertIdle()
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Requests("/v1/chat/completions", "upstream_error"))
}

func TestFirstByteTimeout(t *testing.T) {
	stalled := startFaultServer(t, stall)
	f := startFleet(t, nil, func(c *config.Config) {
		c.Health.Interval = time.Hour
		c.Limits.FirstByteTimeout = 300 * time.Millisecond
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://" + stalled.addr()}}
	})
	start := time.Now()
	resp := f.post("/v1/chat/completions", chatBody)
	body := readAll(t, resp)
	assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode, body)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Zero(t, f.r.Frontend.Metrics().Retries(), "a timeout is not retried")
	f.assertIdle()
}

func TestHealthRemovesAndRestoresWorkers(t *testing.T) {
	// Worker 2 stops and starts again on the same address: on 127.0.0.4,
	// so that no other test's listener or outgoing connection on
	// 127.0.0.1 takes its port meanwhile.
	second, err := mockworker.Start("127.0.0.4:0", mockworker.Options{ID: 2, Tokens: 1})
	require.NoError(t, err)
	f := startFleet(t, mocks(1, 1, 0), func(c *config.Config) {
		c.Health.UnhealthyAfter = 2
		c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: 2, URL: second.URL()})
	})
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 2 }, 5*time.Second, 20*time.Millisecond)
	addr := second.Addr()
	require.NoError(t, second.Close())
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 1 }, 5*time.Second, 20*time.Millisecond)
	for i := 0; i < 4; i++ {
		resp := f.post("/v1/chat/completions", chatBody)
		readAll(t, resp)
		assert.Equal(t, "1", resp.Header.Get("x-fastroute-worker"))
	}
	m, err := mockworker.Start(addr, mockworker.Options{ID: 2})
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 2 }, 5*time.Second, 20*time.Millisecond)
	f.assertIdle()
}

func TestModelsUnion(t *testing.T) {
	opts := mocks(2, 1, 0)
	opts[0].Model, opts[1].Model = "llama", "qwen"
	opts[1].LoRAs = []string{"sql-lora"}
	f := startFleet(t, opts, func(c *config.Config) { c.Workers[0].LoRAs = []string{"cfg-lora"} }) // not advertised
	require.Eventually(t, func() bool {
		resp, err := f.client.Get("http://" + f.r.Addr() + "/v1/models")
		require.NoError(t, err)
		body := readAll(t, resp)
		return strings.Contains(body, `"llama"`) && strings.Contains(body, `"qwen"`) && strings.Contains(body, `"sql-lora"`)
	}, 5*time.Second, 20*time.Millisecond)
	resp, err := f.client.Get("http://" + f.r.Addr() + "/v1/models")
	require.NoError(t, err)
	var list struct {
		Data []map[string]any
	}
	require.NoError(t, json.Unmarshal([]byte(readAll(t, resp)), &list))
	require.Len(t, list.Data, 4)
	assert.Equal(t, map[string]any{"id": "sql-lora", "object": "model", "created": 1764600000.0, "owned_by": "vllm",
		"root": "/adapters/sql-lora", "parent": "qwen", "max_model_len": 8192.0}, list.Data[3], "the worker's own fields pass through")
	assert.Equal(t, map[string]any{"id": "cfg-lora", "object": "model", "owned_by": "fastroute"}, list.Data[0],
		"an adapter only the config names gets a minimal entry")
	assert.Equal(t, "llama", list.Data[1]["id"], "sorted by id")

	// HEAD, as an engine's GET routes take it; other methods are refused.
	for _, path := range []string{"/v1/models", "/v1/models/llama"} {
		resp, body := f.send("HEAD", path, "")
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Empty(t, body)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), path)
	}
	resp, body := f.send("DELETE", "/v1/models", "")
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	assert.Contains(t, body, "method DELETE not allowed; use GET, HEAD")
}

// A fleet serving two base models sends each request to a worker that
// serves its model (learned from the workers' /v1/models), streamed or
// not, in the default mode too; a model whose servers are all down is a
// 503 while the other model is still served.
func TestEachModelGoesToItsServers(t *testing.T) {
	for _, mode := range []pickers.Mode{pickers.ModeRoundRobin, pickers.ModeWeighted} {
		t.Run(string(mode), func(t *testing.T) {
			opts := mocks(3, 2, 0)
			opts[0].Model, opts[1].Model, opts[2].Model = "llama", "llama", "qwen"
			opts[2].LoRAs = []string{"sql-lora"}
			f := startFleet(t, opts, func(c *config.Config) { c.Router.Mode = mode })
			require.Eventually(t, func() bool {
				snap := f.r.Registry.Snapshot()
				return snap.ModelGroup([]byte("llama")) != nil && snap.ModelGroup([]byte("qwen")) != nil
			}, 5*time.Second, 10*time.Millisecond, "the health loop learns the workers' models")
			chat := func(model string, stream bool) string {
				return fmt.Sprintf(`{"model":%q,"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
			}
			llama := map[string]bool{}
			for i := 0; i < 8; i++ {
				llama[f.servedBy("/v1/chat/completions", chat("llama", i%2 == 0))] = true
				assert.Equal(t, "3", f.servedBy("/v1/chat/completions", chat("qwen", i%2 == 0)))
				assert.Equal(t, "3", f.servedBy("/v1/completions", `{"model":"sql-lora","prompt":"x"}`))
			}
			assert.Subset(t, []string{"1", "2"}, slices.Collect(maps.Keys(llama)))
			if mode == pickers.ModeRoundRobin {
				assert.Len(t, llama, 2, "round-robin goes round the model's servers")
			}

			resp := f.post("/v1/chat/completions", chat("qwen", false), "x-worker-id", "1")
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
			assert.Contains(t, readAll(t, resp), `worker 1 does not hold model \"qwen\"`)

			f.mocks[2].Close()
			require.Eventually(t, func() bool { return !f.r.Registry.Snapshot().Has(3) }, 5*time.Second, 10*time.Millisecond)
			resp = f.post("/v1/chat/completions", chat("qwen", false))
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Contains(t, readAll(t, resp), `no routable worker holds model \"qwen\"`)
			assert.Contains(t, []string{"1", "2"}, f.servedBy("/v1/chat/completions", chat("llama", false)))
			f.assertIdle()
		})
	}
}

// A worker whose /v1/models lists nothing routes by the models the config
// declares for it: a request for another model never reaches it, and the
// router's /v1/models names the declared one.
func TestDeclaredModelsRouteAWorkerThatListsNone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	plain := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/v1/models" {
			ctx.SetStatusCode(http.StatusNotFound)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"plain":true}`)
	}}
	go plain.Serve(ln)
	t.Cleanup(func() { plain.Shutdown() })
	opts := mocks(1, 1, 0)
	opts[0].Model = "llama"
	f := startFleet(t, opts, func(c *config.Config) {
		c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: 2, URL: "http://" + ln.Addr().String(), Models: []string{"qwen"}})
	})
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().ModelGroup([]byte("llama")) != nil },
		5*time.Second, 10*time.Millisecond, "the mock lists its model")
	for i := 0; i < 6; i++ {
		assert.Equal(t, "1", f.servedBy("/v1/chat/completions", `{"model":"llama","messages":[]}`))
		assert.Equal(t, "2", f.servedBy("/v1/chat/completions", `{"model":"qwen","messages":[]}`))
	}
	resp, err := f.client.Get("http://" + f.r.Addr() + "/v1/models/qwen")
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"qwen","object":"model","owned_by":"fastroute"}`, readAll(t, resp))
	_, text := adminDo(t, f, "GET", "/workers", "", "")
	var workers []struct {
		ID           uint64
		Models       []string
		ServedModels []string `json:"served_models"`
		Listed       struct{ Models []string }
	}
	require.NoError(t, json.Unmarshal([]byte(text), &workers), text)
	require.Len(t, workers, 2)
	assert.Equal(t, []string{"llama"}, workers[0].Listed.Models)
	assert.Equal(t, []string{"llama"}, workers[0].ServedModels)
	assert.Empty(t, workers[0].Models, "none declared")
	assert.Equal(t, []string{"qwen"}, workers[1].Models)
	assert.Equal(t, []string{"qwen"}, workers[1].ServedModels)
	assert.Empty(t, workers[1].Listed.Models)
	f.assertIdle()
}

// Engines started with an API key (vLLM's --api-key) list their models
// only to a request that carries it: with worker_api_key the router's own
// probes do, and it routes by model; clients' requests carry their own
// Authorization, never the router's key, which no answer, page or log
// shows.
func TestWorkerAPIKeyOpensTheEnginesListings(t *testing.T) {
	const key = "sk-engine-7f3a"
	opts := mocks(2, 1, 0)
	opts[0].Model, opts[1].Model = "llama", "qwen"
	for i := range opts {
		opts[i].APIKey = key
	}
	var logs syncBuffer
	f := startFleetLog(t, opts, func(c *config.Config) { c.WorkerAPIKey = key; c.Log.Access = "all" }, &logs)
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().ModelGroup([]byte("qwen")) != nil },
		5*time.Second, 10*time.Millisecond, "the probes list the models with the key")
	for range 4 {
		assert.Equal(t, "2", f.servedBy("/v1/chat/completions", `{"model":"qwen","messages":[]}`, "Authorization", "Bearer "+key))
	}
	resp := f.post("/v1/chat/completions", `{"model":"qwen","messages":[]}`)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a client without the key is refused by the engine, not let in by the router's")
	readAll(t, resp)
	_, workers := adminDo(t, f, "GET", "/workers", "", "")
	_, metrics := adminDo(t, f, "GET", "/metrics", "", "")
	next := f.r.CurrentConfig()
	next.WorkerAPIKey = key + "-new"
	f.r.SetConfigSource(func() (config.Config, error) { return next, nil })
	code, reload := adminDo(t, f, "POST", "/config/reload", "", "")
	assert.Contains(t, reload, `"applied":["worker_api_key changed"]`, "said changed, never said")
	for what, text := range map[string]string{"GET /workers": workers, "GET /metrics": metrics, "the reload's answer": reload, "the log": logs.String()} {
		assert.NotContains(t, text, key, what)
	}
	assert.Equal(t, http.StatusOK, code, reload)
	f.assertIdle()

	without := startFleet(t, opts, nil)
	time.Sleep(350 * time.Millisecond) // three probe rounds
	assert.False(t, without.r.Registry.Snapshot().Catalog().ListsModels(), "without the key no listing is read")
}

// workerInfo is worker id's object in GET /workers/{id}; nil unless that
// answers 200 with one (safe to call from Eventually's goroutine).
func (f *fleet) workerInfo(id uint64) map[string]any {
	resp, err := f.client.Get(fmt.Sprintf("http://%s/workers/%d", f.r.AdminAddr(), id))
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var w map[string]any
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&w) != nil {
		return nil
	}
	return w
}

func adminDo(t *testing.T, f *fleet, method, path, body, token string) (int, string) {
	req, err := http.NewRequest(method, "http://"+f.r.AdminAddr()+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.client.Do(req)
	require.NoError(t, err)
	return resp.StatusCode, readAll(t, resp)
}

func TestAdmin(t *testing.T) {
	f := startFleet(t, mocks(1, 10, 30*time.Millisecond), func(c *config.Config) { c.AdminToken = "s3cret" })
	extra, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 2})
	require.NoError(t, err)
	t.Cleanup(func() { extra.Close() })

	spec := fmt.Sprintf(`{"id":2,"url":%q}`, extra.URL())
	code, body := adminDo(t, f, "POST", "/workers", spec, "")
	assert.Equal(t, http.StatusUnauthorized, code, body)
	code, body = adminDo(t, f, "POST", "/workers", spec, "wrong")
	assert.Equal(t, http.StatusUnauthorized, code, body)
	code, body = adminDo(t, f, "POST", "/workers", spec, "s3cret")
	assert.Equal(t, http.StatusCreated, code, body)
	code, body = adminDo(t, f, "POST", "/workers", spec, "s3cret")
	assert.Equal(t, http.StatusConflict, code, body)
	code, body = adminDo(t, f, "POST", "/workers", `{"id":3,"url":"nope"}`, "s3cret")
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, "url:")
	code, body = adminDo(t, f, "POST", "/workers", `{"id":3,"bogus":1}`, "s3cret")
	assert.Equal(t, http.StatusBadRequest, code, body)
	// Routable once its first health probe passes.
	require.Eventually(t, func() bool { return f.r.Registry.Snapshot().Len() == 2 }, 2*time.Second, 10*time.Millisecond)

	// Drain worker 1 while a stream runs on it: the stream finishes, new
	// requests go to worker 2, and worker 1 leaves once idle.
	inflight := f.post("/v1/chat/completions", streamBody, "x-worker-id", "1")
	code, body = adminDo(t, f, "DELETE", "/workers/1", "", "s3cret")
	assert.Equal(t, http.StatusAccepted, code, body)
	code, _ = adminDo(t, f, "DELETE", "/workers/77", "", "s3cret")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = adminDo(t, f, "DELETE", "/workers/x", "", "s3cret")
	assert.Equal(t, http.StatusBadRequest, code)
	for i := 0; i < 3; i++ {
		resp := f.post("/v1/chat/completions", chatBody)
		readAll(t, resp)
		assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
	}
	code, body = adminDo(t, f, "GET", "/workers", "", "s3cret")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `"draining":true`)
	assert.Contains(t, body, `"occupancy":1`)
	full := readAll(t, inflight)
	assert.Contains(t, full, "data: [DONE]", "in-flight request on a draining worker finishes")
	require.Eventually(t, func() bool { _, ok := f.r.Registry.Get(1); return !ok }, 5*time.Second, 20*time.Millisecond)

	code, body = adminDo(t, f, "GET", "/metrics", "", "s3cret")
	assert.Equal(t, http.StatusOK, code)
	for _, name := range []string{"fastroute_requests_total{", "fastroute_worker_inflight{", "fastroute_worker_weight{",
		"fastroute_route_seconds_bucket", "fastroute_upstream_first_byte_seconds_count", "fastroute_request_seconds_sum",
		"fastroute_retries_total", "fastroute_client_connections ", "fastroute_accept_shortages_total 0",
		"fastroute_max_connections_reached_total 0",
		"fastroute_client_connections_max " + strconv.Itoa(frontend.DefaultMaxConnections())} {
		assert.Contains(t, body, name)
	}
	_, after, ok := strings.Cut(body, "\ngo_goroutines ")
	require.True(t, ok, "the goroutine count is exported")
	n, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(after, "\n", 2)[0]))
	require.NoError(t, err)
	assert.InDelta(t, runtime.NumGoroutine(), n, 20, "the router's goroutines (this test's process)")
	code, _ = adminDo(t, f, "GET", "/debug/pprof/", "", "s3cret")
	assert.Equal(t, http.StatusOK, code)
	f.assertIdle()
}

func TestStartRefusesBadConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Router.Mode = "fastest"
	_, err := Start(cfg, nil)
	assert.ErrorContains(t, err, "router.mode")
	cfg = config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "256.0.0.1:1"
	_, err = Start(cfg, nil)
	assert.ErrorContains(t, err, "admin_listen")
}

// TestWeightedModeFollowsTelemetry runs device-aware-weighted end to end: the
// CPU collector reads this machine's /proc, both CPU workers read the same
// cgroup directory and so see the same idle share, so requests split by
// capacity (1 : 0.25); GET /workers shows the weight source and telemetry
// age; a GPU worker without NVML says why it keeps its static capacity; a
// reload's interval applies.
// Engine telemetry is off: this test is about the device weights.
func TestWeightedModeFollowsTelemetry(t *testing.T) {
	cg := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cg, "cpu.max"), []byte("max 100000\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(cg, "cpu.stat"), []byte("usage_usec 1000\n"), 0o644))
	opts := mocks(3, 1, 0)
	f := startFleet(t, opts, func(c *config.Config) {
		c.Router.Mode = pickers.ModeWeighted
		c.Telemetry.Interval = 20 * time.Millisecond
		c.Telemetry.Engine.Enabled = false
		c.Workers[0].CgroupPath, c.Workers[1].CgroupPath = cg, cg
		c.Workers[1].Capacity = 0.25
		c.Workers[2].Device, c.Workers[2].GPUIndex = dataplane.DeviceGPU, 63 // no such GPU anywhere
	})
	var workers []map[string]any
	require.Eventually(t, func() bool {
		_, body := adminDo(t, f, "GET", "/workers", "", "")
		workers = nil
		require.NoError(t, json.Unmarshal([]byte(body), &workers))
		return workers[0]["weight_source"] == "telemetry" && workers[1]["weight_source"] == "telemetry"
	}, 5*time.Second, 20*time.Millisecond)
	assert.Less(t, workers[0]["telemetry_age_seconds"], 1.0)
	assert.Equal(t, "static", workers[2]["weight_source"])
	assert.NotEmpty(t, workers[2]["weight_static_reason"])
	assert.Equal(t, 1.0, workers[2]["weight"], "static capacity")
	require.NoError(t, f.r.Registry.Drain(3)) // its static weight would dwarf the CPU workers'

	counts := map[string]int{}
	const n = 1000
	for i := 0; i < n; i++ {
		resp := f.post("/v1/completions", `{"prompt":"x"}`)
		readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		counts[resp.Header.Get("x-fastroute-worker")]++
	}
	// 4 of 5 and 1 of 5: the bound is 5 standard deviations of 1,000 draws
	// (0.0126 each), where 0.05 was 4 and failed one run in 12,000.
	assert.InDelta(t, 0.8, float64(counts["1"])/n, 0.064, "%v", counts)
	assert.InDelta(t, 0.2, float64(counts["2"])/n, 0.064, "%v", counts)

	_, body := adminDo(t, f, "GET", "/metrics", "", "")
	for _, name := range []string{"\nfastroute_cpu_idle_ratio ", "\nfastroute_worker_weight{worker=\"1\"}",
		"# TYPE fastroute_gpu_utilization_ratio gauge", "# TYPE fastroute_gpu_memory_used_bytes gauge",
		"\nfastroute_telemetry_fallbacks_total "} {
		assert.Contains(t, body, name)
	}

	// A reload's interval applies from then: read once an hour, the
	// readings age (at 20 ms they never did past a second).
	next := f.r.CurrentConfig()
	next.Telemetry.Interval = time.Hour
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Contains(t, applied, "telemetry.interval=1h0m0s") // and worker 3, drained by hand, back
	assert.Empty(t, needRestart)
	require.Eventually(t, func() bool { age, _ := f.workerInfo(1)["telemetry_age_seconds"].(float64); return age > 1 },
		5*time.Second, 20*time.Millisecond)

	// A reload turns the readers off (every worker back at its static
	// capacity: one read at a tenth of it here, the loop's next read an
	// hour away) and on again.
	w2, _ := f.r.Registry.Get(2)
	w2.SetWeight(0.025)
	fellBack, err := strconv.Atoi(metric(t, f, "fastroute_telemetry_fallbacks_total"))
	require.NoError(t, err)
	next.Telemetry.NVML, next.Telemetry.CPU = false, false
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"telemetry.nvml=false telemetry.cpu=false telemetry.interval=1h0m0s"}, applied)
	assert.Empty(t, needRestart)
	assert.Equal(t, 0.25, w2.Weight(), "its static capacity")
	assert.Nil(t, f.workerInfo(2)["weight_source"])
	assert.Empty(t, metric(t, f, "fastroute_cpu_idle_ratio"))
	assert.Empty(t, metric(t, f, "fastroute_telemetry_fallbacks_total"), "shown while a reader runs")
	next.Telemetry.CPU, next.Telemetry.Interval = true, 20*time.Millisecond
	applied, _, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"telemetry.nvml=false telemetry.cpu=true telemetry.interval=20ms"}, applied)
	require.Eventually(t, func() bool { return f.workerInfo(2)["weight_source"] == "telemetry" }, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, "static", f.workerInfo(3)["weight_source"], "a GPU worker, no GPU reader")
	now, err := strconv.Atoi(metric(t, f, "fastroute_telemetry_fallbacks_total"))
	require.NoError(t, err)
	assert.Greater(t, now, fellBack, "the new loop's falls back (worker 3's) counted on from the old one's")
	f.assertIdle()
}

// form is a multipart/form-data body as OpenAI's clients send an audio
// request: the fields, then the file.
func form(model string) (body, contentType string) {
	var b strings.Builder
	mw := multipart.NewWriter(&b)
	if model != "" {
		_ = mw.WriteField("model", model)
	}
	_ = mw.WriteField("language", "en")
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = fw.Write([]byte("RIFF....WAVEfmt "))
	_ = mw.Close()
	return b.String(), mw.FormDataContentType()
}

func TestAFormRoutesByItsModelField(t *testing.T) {
	opts := mocks(3, 2, 0)
	opts[0].Model, opts[1].Model, opts[2].Model = "llama", "llama", "whisper"
	f := startFleet(t, opts, func(c *config.Config) { c.Router.SessionAffinity.Mode = "hard" })
	require.Eventually(t, func() bool {
		return f.r.Registry.Snapshot().ModelGroup([]byte("whisper")) != nil
	}, 5*time.Second, 10*time.Millisecond, "the health loop learns the workers' models")
	for range 6 { // round-robin would go round all three
		body, ct := form("whisper")
		assert.Equal(t, "3", f.servedBy("/v1/audio/transcriptions", body, "Content-Type", ct))
	}
	body, ct := form("nope")
	resp := f.post("/v1/audio/transcriptions", body, "Content-Type", ct)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `model \"nope\"`)

	// A form without a model, or one the router cannot read, goes as it is.
	body, ct = form("")
	assert.NotEmpty(t, f.servedBy("/v1/audio/transcriptions", body, "Content-Type", ct))
	_, worker, _ := f.do("POST", "/v1/audio/transcriptions", "--x\r\nnot a form", "Content-Type", "multipart/form-data; boundary=x")
	assert.NotEmpty(t, worker, "the worker judges it")
	resp = f.post("/v1/audio/transcriptions", "--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"+strings.Repeat("m", 2000)+"\r\n--x--\r\n",
		"Content-Type", "multipart/form-data; boundary=x")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), `form field \"model\" is longer than 1024 bytes`)
	twice := "--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n" +
		"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF....\r\n" +
		"--x\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nllama\r\n--x--\r\n"
	resp = f.post("/v1/audio/transcriptions", twice, "Content-Type", "multipart/form-data; boundary=x")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "a second model field, past the file")
	assert.Contains(t, readAll(t, resp), `form field \"model\" appears more than once`)

	// The session header routes a request whatever its body.
	body, ct = form("")
	first := f.servedBy("/v1/audio/transcriptions", body, "Content-Type", ct, "x-session-id", "s1")
	for range 4 {
		assert.Equal(t, first, f.servedBy("/v1/audio/transcriptions", body, "Content-Type", ct, "x-session-id", "s1"))
	}
	f.assertIdle()
}
