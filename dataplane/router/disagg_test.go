package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/pickers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// seen is one request an engine stand-in received.
type seen struct {
	body      map[string]any
	requestID string
	path      string
	keys      string // the Authorization and x-api-key headers, "|" between
	// traceparent is the header as it came, "" when none did.
	traceparent  string
	forwardedFor string // its X-Forwarded-For lines, joined with " | "
	rank         string // its X-Data-Parallel-Rank header
	raw          []byte // the body as it came (body's numbers are float64s)
}

// standIn is a stand-in for one engine over loopback: it records what it
// receives and answers with answer.
type standIn struct {
	*httptest.Server
	mu     sync.Mutex
	got    []seen
	answer func(w http.ResponseWriter, r *http.Request, body map[string]any)
}

func startEngine(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, body map[string]any)) *standIn {
	t.Helper()
	e := &standIn{answer: answer}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			if r.URL.Path == "/health" {
				_, _ = io.WriteString(w, "ok")
				return
			}
			http.NotFound(w, r)
			return
		}
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(b, &body)
		e.mu.Lock()
		e.got = append(e.got, seen{body: body, requestID: r.Header.Get("X-Request-Id"), path: r.URL.Path,
			keys: r.Header.Get("Authorization") + "|" + r.Header.Get("X-Api-Key"), traceparent: r.Header.Get("traceparent"),
			forwardedFor: strings.Join(r.Header.Values("X-Forwarded-For"), " | "), rank: r.Header.Get("X-Data-Parallel-Rank"), raw: b})
		e.mu.Unlock()
		e.answer(w, r, body)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *standIn) received() []seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seen(nil), e.got...)
}

const kvParams = `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"p1","remote_block_ids":[4,5],"remote_host":"10.0.0.1","remote_port":5600}`

// vllmPrefill answers a prefill request as vLLM with a KV connector does.
func vllmPrefill(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],"kv_transfer_params":`+kvParams+`}`)
}

// sseDecode streams a short answer.
func sseDecode(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	for i := 0; i < 3; i++ {
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"d%d\"}}]}\n\n", i)
		w.(http.Flusher).Flush()
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// stallUntilCut holds the request until the router closes its connection.
func stallUntilCut(cut chan<- struct{}) func(http.ResponseWriter, *http.Request, map[string]any) {
	return func(_ http.ResponseWriter, r *http.Request, _ map[string]any) {
		<-r.Context().Done()
		cut <- struct{}{}
	}
}

// startPD runs a router in front of engines given as (role, server) pairs,
// ids from 1 in order.
func startPD(t *testing.T, protocol string, workers []pdWorker, tweak func(*config.Config)) *fleet {
	t.Helper()
	return startFleet(t, nil, func(c *config.Config) {
		c.Router.Disaggregation.Protocol = protocol
		c.Router.Retries = 2
		for i, w := range workers {
			c.Workers = append(c.Workers, dataplane.WorkerSpec{ID: uint64(i + 1), URL: w.url, Role: w.role, BootstrapPort: 8998 + i})
		}
		if tweak != nil {
			tweak(c)
		}
	})
}

type pdWorker struct {
	role dataplane.Role
	url  string
}

const pdBody = `{"model":"m","messages":[{"role":"user","content":"a long prompt"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"max_completion_tokens":60,"min_tokens":2,"temperature":0.5}`

// A split request's prefill leg gets the body vLLM's prefill wants, its
// decode leg the client's with the prefill's transfer parameters; both
// carry the request's id and the one X-Forwarded-For line
// (add_x_forwarded_for).
func TestVLLMDisaggregationBodiesAndAnswer(t *testing.T) {
	prefill, decode := startEngine(t, vllmPrefill), startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode.URL}},
		func(c *config.Config) { c.AddXForwardedFor = true })

	resp := f.post("/v1/chat/completions", pdBody, "X-Request-Id", "req-42", "X-Forwarded-For", "203.0.113.7")
	require.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
	out := readAll(t, resp)
	assert.Contains(t, out, "d2")
	assert.True(t, strings.HasSuffix(out, "data: [DONE]\n\n"))

	p, d := prefill.received(), decode.received()
	require.Len(t, p, 1)
	require.Len(t, d, 1)
	pb := p[0].body
	assert.Equal(t, false, pb["stream"])
	assert.EqualValues(t, 1, pb["max_tokens"])
	assert.EqualValues(t, 1, pb["max_completion_tokens"])
	for _, k := range []string{"stream_options", "min_tokens", "min_completion_tokens"} {
		assert.NotContains(t, pb, k)
	}
	assert.Equal(t, map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}, pb["kv_transfer_params"])
	assert.Equal(t, "m", pb["model"])
	assert.Equal(t, 0.5, pb["temperature"])

	var client, want map[string]any
	require.NoError(t, json.Unmarshal([]byte(pdBody), &client))
	require.NoError(t, json.Unmarshal([]byte(kvParams), &want))
	client["kv_transfer_params"] = want
	assert.Equal(t, client, d[0].body, "the decode worker gets the client's body and the prefill's transfer parameters")
	assert.Equal(t, "req-42", p[0].requestID)
	assert.Equal(t, "req-42", d[0].requestID)
	assert.Equal(t, "203.0.113.7, 127.0.0.1", p[0].forwardedFor)
	assert.Equal(t, "203.0.113.7, 127.0.0.1", d[0].forwardedFor)

	// Without a client id both legs share a made-up one.
	readAll(t, f.post("/v1/chat/completions", pdBody))
	p, d = prefill.received(), decode.received()
	assert.NotEmpty(t, p[1].requestID)
	assert.Equal(t, p[1].requestID, d[1].requestID)

	f.assertIdle()
	m := f.r.Frontend.Metrics()
	assert.EqualValues(t, 2, m.Phase("prefill", "ok"))
	assert.EqualValues(t, 2, m.Phase("decode", "ok"))
	for _, w := range []string{"1", "2"} { // each leg counts on its worker
		assert.Equal(t, "2", metric(t, f, `fastroute_worker_answers_total{worker="`+w+`",code="2xx"}`), "worker %s", w)
		assert.Equal(t, "2", metric(t, f, `fastroute_worker_first_byte_seconds_count{worker="`+w+`"}`), "worker %s", w)
	}

	// Query-only names both picks and dispatches nothing.
	resp = f.post("/v1/chat/completions", pdBody, "x-query-instance-id", "true")
	assert.JSONEq(t, `{"prefill_worker_id":1,"decode_worker_id":2,"dp_rank":0}`, readAll(t, resp))
	assert.Len(t, prefill.received(), 2)
	f.assertIdle()
}

func TestVLLMDisaggregationFailures(t *testing.T) {
	noParams := startEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})
	decode := startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, noParams.URL}, {dataplane.RoleDecode, decode.URL}}, nil)
	resp := f.post("/v1/chat/completions", pdBody)
	assert.Equal(t, 502, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "prefill worker 1: answer has no kv_transfer_params")
	assert.Empty(t, decode.received(), "never a silent aggregated run")
	f.assertIdle()

	// A prefill worker that refuses connections: the request moves to the
	// other prefill worker; the decode worker gets that one's parameters.
	prefill := startEngine(t, vllmPrefill)
	f = startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, "http://" + deadAddr(t)}, {dataplane.RolePrefill, prefill.URL},
		{dataplane.RoleDecode, "http://" + deadAddr(t)}, {dataplane.RoleDecode, decode.URL}}, nil)
	for i := 0; i < 4; i++ {
		resp = f.post("/v1/chat/completions", pdBody)
		out := readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, out)
	}
	for _, s := range decode.received()[:4] {
		assert.Equal(t, "p1", s.body["kv_transfer_params"].(map[string]any)["remote_engine_id"], "a decode retry keeps the transfer parameters")
	}
	f.assertIdle()

	// A prefill answer over limits.answer_buffer_bytes, of known length or
	// chunked: a 502 saying so, not a prefill read into memory whatever its
	// size; the decode worker gets nothing.
	for _, known := range []bool{true, false} {
		big := `{"choices":[],"pad":"` + strings.Repeat("p", 10<<10) + `","kv_transfer_params":` + kvParams + `}`
		huge := startEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
			if known {
				w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			}
			_, _ = io.WriteString(w, big)
		})
		decode := startEngine(t, sseDecode)
		f = startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, huge.URL}, {dataplane.RoleDecode, decode.URL}},
			func(c *config.Config) { c.Limits.AnswerBufferBytes = 4 << 10 })
		resp = f.post("/v1/chat/completions", pdBody)
		assert.Equal(t, 502, resp.StatusCode, "known length %v", known)
		assert.Contains(t, readAll(t, resp), "prefill worker 1 answered more than limits.answer_buffer_bytes (4096 bytes)")
		assert.Empty(t, decode.received())
		f.assertIdle()
	}

	// Prefill workers whose answers break after their first byte (a head
	// with two lengths, a body cut by the close): the request reached one
	// of them once, moves to no other, and the 502 says how it broke.
	for head, why := range map[string]string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}": "answer headers not valid HTTP",
		"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"choices\"":          "connection closed mid-answer",
	} {
		broken := func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
			c, _, err := http.NewResponseController(w).Hijack()
			require.NoError(t, err)
			_, _ = io.WriteString(c, head)
			_ = c.Close()
		}
		one, other := startEngine(t, broken), startEngine(t, broken)
		decode := startEngine(t, sseDecode)
		f = startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, one.URL}, {dataplane.RolePrefill, other.URL},
			{dataplane.RoleDecode, decode.URL}}, nil)
		resp = f.post("/v1/chat/completions", pdBody)
		assert.Equal(t, 502, resp.StatusCode, why)
		assert.Regexp(t, `prefill worker \d broke its answer: `+why, readAll(t, resp))
		assert.Len(t, append(one.received(), other.received()...), 1, "%s: sent once, to one prefill worker", why)
		assert.Empty(t, decode.received())
		f.assertIdle()
	}

	// The only prefill worker dead: a 502 naming it.
	f = startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, "http://" + deadAddr(t)}, {dataplane.RoleDecode, decode.URL}}, nil)
	resp = f.post("/v1/chat/completions", pdBody)
	assert.Equal(t, 502, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "prefill worker 1 failed before answering: connection refused")
	f.assertIdle()
}

// A prefill answer is read whole and once however it is framed (stated
// length, chunked, read to its worker's close, HTTP/1.0), whole at once or
// in pieces that come apart: its kv_transfer_params reach the decode
// worker. (A read that
// met the close once returned the count of the read before it, and an
// answer read to its close came twice, head and all: not JSON, a 502.)
func TestAPrefillAnswerHoweverFramed(t *testing.T) {
	answer := `{"id":"cmpl-1","object":"chat.completion","choices":[],"kv_transfer_params":` + kvParams + `}`
	heads := []string{
		fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(answer)),
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n",
		"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n",
	}
	for i := range 2 * len(heads) {
		head, piece := heads[i/2], []int{len(answer), 40}[i%2]
		chunked := strings.Contains(head, "chunked")
		prefill := startEngine(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
			c, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			out := head
			for rest := answer; rest != ""; {
				p := rest[:min(len(rest), piece)]
				rest = rest[len(p):]
				if chunked {
					p = fmt.Sprintf("%x\r\n%s\r\n", len(p), p)
				}
				if out += p; piece < len(answer) { // pieces come apart
					_, _ = io.WriteString(c, out)
					out = ""
					time.Sleep(time.Millisecond)
				}
			}
			if chunked {
				out += "0\r\n\r\n"
			}
			_, _ = io.WriteString(c, out)
		})
		decode := startEngine(t, sseDecode)
		f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode.URL}}, nil)
		resp := f.post("/v1/chat/completions", pdBody)
		out := readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, "%q in pieces of %d: %s", head, piece, out)
		assert.Contains(t, out, "data: [DONE]")
		got := decode.received()
		require.Len(t, got, 1)
		assert.Equal(t, "p1", got[0].body["kv_transfer_params"].(map[string]any)["remote_engine_id"], head)
		f.assertIdle()
	}
}

func TestPrefillPoolEmptyFallbacksAndShortPrompts(t *testing.T) {
	decode := startEngine(t, sseDecode)
	prefill := startEngine(t, vllmPrefill)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RoleDecode, decode.URL}}, nil)
	resp := f.post("/v1/chat/completions", pdBody)
	assert.Equal(t, 200, resp.StatusCode)
	readAll(t, resp)
	assert.NotContains(t, decode.received()[0].body, "kv_transfer_params", "aggregated: the client's body as it is")
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().DisaggFallbacks("no_prefill_worker"))
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Phase("aggregated", "ok"))

	f = startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RoleDecode, decode.URL}}, func(c *config.Config) {
		c.Router.Disaggregation.Fallback = config.FallbackError
	})
	resp = f.post("/v1/chat/completions", pdBody)
	assert.Equal(t, 503, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "no routable worker serves the prefill phase")
	next := f.r.CurrentConfig() // a reload changes the fallback for the next request
	next.Router.Disaggregation.Fallback = config.FallbackAggr
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.disaggregation.fallback=aggregated"}, applied)
	assert.Empty(t, needRestart)
	resp = f.post("/v1/chat/completions", pdBody)
	assert.Equal(t, 200, resp.StatusCode)
	readAll(t, resp)
	f.assertIdle()

	// min_prefill_tokens: a short prompt runs whole on a decode worker.
	f = startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode.URL}}, func(c *config.Config) {
		c.Router.Disaggregation.MinPrefillTokens = 1000
	})
	readAll(t, f.post("/v1/chat/completions", pdBody))
	assert.Empty(t, prefill.received())
	next = f.r.CurrentConfig() // lowered by a reload: the next prompt splits
	next.Router.Disaggregation.MinPrefillTokens = 0
	applied, needRestart, err = f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.disaggregation.min_prefill_tokens=0"}, applied)
	assert.Empty(t, needRestart)
	readAll(t, f.post("/v1/chat/completions", pdBody))
	assert.Len(t, prefill.received(), 1)
	// Named workers: the phase headers, checked against the roles.
	resp = f.post("/v1/chat/completions", pdBody, "x-prefill-worker-id", "2")
	assert.Equal(t, 400, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "worker 2 has role decode and does not serve the prefill phase")
	resp = f.post("/v1/chat/completions", pdBody, "x-prefill-worker-id", "1", "x-decode-worker-id", "2")
	assert.Equal(t, 200, resp.StatusCode)
	readAll(t, resp)
	assert.Len(t, prefill.received(), 2, "a named prefill worker splits")
	f.assertIdle()
}

// A worker of role both may be both picks of a split request: the request
// then runs whole there, since a split would only send its KV cache from
// the engine to itself.
func TestASplitWhosePicksAreOneWorkerRunsWhole(t *testing.T) {
	both := startEngine(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		if _, prefill := body["kv_transfer_params"]; prefill {
			vllmPrefill(w, r, body)
			return
		}
		sseDecode(w, r, body)
	})
	decode := startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RoleBoth, both.URL}, {dataplane.RoleDecode, decode.URL}}, nil)
	workers := map[string]int{}
	for range 4 { // round-robin: the decode picks take turns, worker 1 prefills
		resp := f.post("/v1/chat/completions", pdBody)
		require.Equal(t, 200, resp.StatusCode)
		assert.Contains(t, readAll(t, resp), "d2")
		workers[resp.Header.Get("x-fastroute-worker")]++
	}
	assert.Equal(t, map[string]int{"1": 2, "2": 2}, workers)
	var whole, prefills int
	for _, r := range both.received() {
		kv, _ := r.body["kv_transfer_params"].(map[string]any)
		switch {
		case kv == nil:
			assert.JSONEq(t, pdBody, string(r.raw), "whole: the client's body as it is")
			whole++
		case kv["do_remote_decode"] == true:
			prefills++
		default:
			t.Errorf("worker 1 got a decode leg: %s", r.raw)
		}
	}
	assert.Equal(t, [2]int{2, 2}, [2]int{whole, prefills}, "worker 1: its own two requests whole, the prefills of worker 2's")
	for _, r := range decode.received() {
		assert.Contains(t, r.body, "kv_transfer_params")
	}
	f.assertIdle()
	m := f.r.Frontend.Metrics()
	assert.EqualValues(t, 2, m.Phase("aggregated", "ok"))
	assert.EqualValues(t, 2, m.Phase("prefill", "ok"))
	assert.EqualValues(t, 2, m.Phase("decode", "ok"))
	assert.Equal(t, "2", metric(t, f, `fastroute_disagg_fallbacks_total{reason="one_worker"}`))
	assert.EqualValues(t, 0, m.DisaggFallbacks("no_prefill_worker"))

	// Query-only says what would run: the whole request, then the split.
	resp := f.post("/v1/chat/completions", pdBody, "x-query-instance-id", "true")
	assert.JSONEq(t, `{"worker_id":1,"dp_rank":0}`, readAll(t, resp))
	resp = f.post("/v1/chat/completions", pdBody, "x-query-instance-id", "true")
	assert.JSONEq(t, `{"prefill_worker_id":1,"decode_worker_id":2,"dp_rank":0}`, readAll(t, resp))
	f.assertIdle()
}

// A split request runs whole on its decode worker while its prefill pool
// is busy (fallback aggregated), and while its prefill pick's engine
// reports router.disaggregation.max_prefill_queue requests waiting: the
// decode engine prefills it itself.
func TestASplitRunsWholeWhileThePrefillPoolIsBusyOrQueued(t *testing.T) {
	var waiting atomic.Int64
	var hold atomic.Bool
	release := make(chan struct{})
	prefill := scriptedEngineAnswering(t, func() string {
		return fmt.Sprintf("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting %d\n", waiting.Load())
	}, func(w http.ResponseWriter, r *http.Request) {
		if hold.Load() {
			<-release
		}
		vllmPrefill(w, r, nil)
	})
	decode := startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, "http://" + prefill}, {dataplane.RoleDecode, decode.URL}}, func(c *config.Config) {
		c.Workers[0].MaxInflight = 1
		c.Router.Disaggregation.MaxPrefillQueue = 2
		c.Telemetry.Engine.Interval = 20 * time.Millisecond
	})
	waitingSeen := func(n int64) {
		t.Helper()
		require.Eventually(t, func() bool { return f.workerInfo(1)["engine_waiting"] == float64(n) }, 5*time.Second, 10*time.Millisecond)
	}
	// lastDecode reports whether the decode worker's last request was a
	// split's decode leg (it carries the prefill's transfer parameters).
	lastDecode := func() bool {
		got := decode.received()
		require.NotEmpty(t, got)
		_, split := got[len(got)-1].body["kv_transfer_params"]
		return split
	}
	post := func() {
		t.Helper()
		resp := f.post("/v1/chat/completions", pdBody)
		assert.Equal(t, 200, resp.StatusCode)
		assert.Contains(t, readAll(t, resp), "d2")
	}
	m := f.r.Frontend.Metrics()

	waitingSeen(0)
	post()
	assert.True(t, lastDecode(), "an idle prefill engine: split")

	// The prefill worker's one slot held by a split whose prefill waits.
	hold.Store(true)
	first := make(chan struct{})
	go func() {
		defer close(first)
		post()
	}()
	require.Eventually(t, func() bool { return f.workerInfo(1)["occupancy"] == 1.0 }, 5*time.Second, 5*time.Millisecond)
	post()
	assert.False(t, lastDecode(), "the prefill pool busy: whole")
	assert.EqualValues(t, 1, m.DisaggFallbacks("no_prefill_worker"))
	close(release)
	<-first
	hold.Store(false)

	waiting.Store(2)
	waitingSeen(2)
	post()
	assert.False(t, lastDecode(), "two waiting at the prefill engine: whole")
	assert.Equal(t, "1", metric(t, f, `fastroute_disagg_fallbacks_total{reason="prefill_queue"}`))
	resp := f.post("/v1/chat/completions", pdBody, "x-prefill-worker-id", "1")
	readAll(t, resp)
	assert.True(t, lastDecode(), "a named prefill worker splits regardless")

	waiting.Store(1)
	waitingSeen(1)
	post()
	assert.True(t, lastDecode(), "one waiting: split")
	f.assertIdle()
	assert.EqualValues(t, 4, m.Phase("prefill", "ok"))
	assert.EqualValues(t, 2, m.Phase("aggregated", "ok"))
}

// With prefix affinity and min_prefill_tokens, the next turn of a
// conversation goes whole to the decode worker that decoded the turn
// before, whose engine holds all of it but the new message; a turn that
// adds more than min_prefill_tokens splits again.
func TestAConversationsNextTurnRunsWholeOnItsDecodeWorker(t *testing.T) {
	prefill := startEngine(t, vllmPrefill)
	decoders := []*standIn{startEngine(t, sseDecode), startEngine(t, sseDecode)}
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decoders[0].URL},
		{dataplane.RoleDecode, decoders[1].URL}}, func(c *config.Config) {
		c.Router.PrefixAffinity.Enabled = true
		c.Router.Disaggregation.MinPrefillTokens = 150 // 600 bytes
	})
	messages := []map[string]string{{"role": "user", "content": strings.Repeat("a long document. ", 120)}}
	// turn sends the conversation so far and reports its worker and
	// whether its decode leg came with a prefill's transfer parameters.
	turn := func() (worker string, split bool) {
		t.Helper()
		body, err := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": messages})
		require.NoError(t, err)
		resp := f.post("/v1/chat/completions", string(body))
		require.Equal(t, 200, resp.StatusCode)
		assert.Contains(t, readAll(t, resp), "d2")
		worker = resp.Header.Get("x-fastroute-worker")
		got := decoders[map[string]int{"2": 0, "3": 1}[worker]].received()
		_, split = got[len(got)-1].body["kv_transfer_params"]
		return worker, split
	}
	first, split := turn()
	require.True(t, split, "the first turn splits")
	messages = append(messages, map[string]string{"role": "assistant", "content": "d0d1d2"}, map[string]string{"role": "user", "content": "and then?"})
	w, split := turn()
	assert.Equal(t, first, w, "the decode worker of the turn before")
	assert.False(t, split, "it holds all of it but the new message: whole")
	assert.Len(t, prefill.received(), 1)
	assert.Equal(t, "1", metric(t, f, `fastroute_disagg_fallbacks_total{reason="cached"}`))
	messages = append(messages, map[string]string{"role": "user", "content": strings.Repeat("more text ", 100)})
	w, split = turn()
	assert.True(t, split, "1,000 bytes new: split again")
	assert.Equal(t, first, w)
	assert.Len(t, prefill.received(), 2)
	f.assertIdle()
}

func TestClientLeavingDuringPrefillOrDecodeCutsBoth(t *testing.T) {
	cut := make(chan struct{}, 2)
	stalledPrefill, decode := startEngine(t, stallUntilCut(cut)), startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, stalledPrefill.URL}, {dataplane.RoleDecode, decode.URL}}, nil)
	conn := f.sendRaw(pdBody)
	require.Eventually(t, func() bool { return len(stalledPrefill.received()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, conn.Close())
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatal("the prefill request was not cut")
	}
	f.assertIdle()
	assert.Empty(t, decode.received())
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Phase("prefill", "cancelled"))

	prefill, stalledDecode := startEngine(t, vllmPrefill), startEngine(t, stallUntilCut(cut))
	f = startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, stalledDecode.URL}}, nil)
	conn = f.sendRaw(pdBody)
	require.Eventually(t, func() bool { return len(stalledDecode.received()) == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, conn.Close())
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatal("the decode request was not cut")
	}
	f.assertIdle()
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().Phase("decode", "cancelled"))
}

// bootstrapEngines starts stand-ins of a prefill and a decode engine of
// SGLang's bootstrap protocol: the decode streams its answer once a
// prefill request came beside it (both are in flight at once), and fails
// after 5 s without one.
func bootstrapEngines(t *testing.T) (prefill, decode *standIn) {
	arrived := make(chan struct{}, 16)
	prefill = startEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		arrived <- struct{}{}
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})
	decode = startEngine(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		select {
		case <-arrived:
		case <-time.After(5 * time.Second):
			http.Error(w, "no prefill request beside this one", 500)
			return
		}
		sseDecode(w, r, body)
	})
	return prefill, decode
}

func TestSGLangBootstrap(t *testing.T) {
	prefill, decode := bootstrapEngines(t)
	f := startPD(t, config.DisaggSGLang, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode.URL}}, nil)
	resp := f.post("/v1/chat/completions", pdBody)
	require.Equal(t, 200, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "data: [DONE]")
	p, d := prefill.received(), decode.received()
	require.Len(t, p, 1)
	require.Len(t, d, 1)
	assert.Equal(t, p[0].body, d[0].body, "the same body to both")
	assert.Equal(t, "127.0.0.1", d[0].body["bootstrap_host"])
	assert.EqualValues(t, 8998, d[0].body["bootstrap_port"])
	room, ok := d[0].body["bootstrap_room"].(float64)
	assert.True(t, ok && room >= 0, "a room: %v", d[0].body["bootstrap_room"])
	assert.Equal(t, true, d[0].body["stream"], "the client's fields as they are")
	f.assertIdle()
	assert.Equal(t, "1", metric(t, f, `fastroute_worker_answers_total{worker="1",code="2xx"}`), "the prefill leg's answer")

	// A prefill that fails cuts the decode request, and the client is told.
	cut := make(chan struct{}, 1)
	failing := startEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		time.Sleep(50 * time.Millisecond)
		http.Error(w, `{"error":"bootstrap failed"}`, 500)
	})
	waiting := startEngine(t, stallUntilCut(cut))
	f = startPD(t, config.DisaggSGLang, []pdWorker{{dataplane.RolePrefill, failing.URL}, {dataplane.RoleDecode, waiting.URL}}, nil)
	resp = f.post("/v1/chat/completions", pdBody)
	assert.Equal(t, 502, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "prefill worker 1 failed")
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Fatal("the decode request was not cut")
	}
	f.assertIdle()
	assert.Equal(t, "1", metric(t, f, `fastroute_worker_answers_total{worker="1",code="5xx"}`))
	for _, reason := range []string{"connect", "transport", "timeout", "cut"} {
		assert.Equal(t, "0", metric(t, f, `fastroute_worker_failures_total{worker="2",reason="`+reason+`"}`),
			"the decode leg the router cut is no failure of its worker")
	}
}

// With data-parallel ranks on SGLang's bootstrap protocol, each leg goes
// to the rank the router chose for it (X-Data-Parallel-Rank), and the room
// names the prefill's: SGLang's decode engine looks for the KV cache on
// prefill rank room % dp_size.
func TestSGLangRoomFollowsThePrefillRank(t *testing.T) {
	prefill, decode := bootstrapEngines(t)
	f := startPD(t, config.DisaggSGLang, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode.URL}},
		func(c *config.Config) { c.Workers[0].DPSize, c.Workers[1].DPSize = 3, 2 })
	for range 6 {
		resp := f.post("/v1/chat/completions", pdBody)
		require.Equal(t, 200, resp.StatusCode)
		assert.Contains(t, readAll(t, resp), "data: [DONE]")
	}
	p, d := prefill.received(), decode.received()
	require.Len(t, p, 6)
	require.Len(t, d, 6)
	room := func(s seen) uint64 {
		var b struct {
			Room uint64 `json:"bootstrap_room"`
		}
		require.NoError(t, json.Unmarshal(s.raw, &b))
		return b.Room
	}
	prefillRanks, decodeRanks := map[string]int{}, map[string]int{}
	for i := range p {
		r := room(p[i])
		assert.Equal(t, r, room(d[i]), "one room for both legs")
		assert.LessOrEqual(t, r, uint64(math.MaxInt64))
		assert.Equal(t, p[i].rank, strconv.FormatUint(r%3, 10), "the room names the prefill's rank")
		prefillRanks[p[i].rank]++
		decodeRanks[d[i].rank]++
	}
	assert.Equal(t, map[string]int{"0": 2, "1": 2, "2": 2}, prefillRanks, "the prefill's ranks in turn")
	assert.Equal(t, map[string]int{"0": 3, "1": 3}, decodeRanks, "the decode's ranks in turn")
	f.assertIdle()
}

// A session keeps its prefill worker and its decode worker, each pinned
// in its own phase.
func TestSessionPinsPerPhase(t *testing.T) {
	p1, p2, d1, d2 := startEngine(t, vllmPrefill), startEngine(t, vllmPrefill), startEngine(t, sseDecode), startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, p1.URL}, {dataplane.RolePrefill, p2.URL},
		{dataplane.RoleDecode, d1.URL}, {dataplane.RoleDecode, d2.URL}}, nil) // round-robin would alternate both
	for i := 0; i < 4; i++ {
		readAll(t, f.post("/v1/chat/completions", pdBody, "x-session-id", "s1"))
	}
	assert.Equal(t, 4, len(p1.received())+len(p2.received()))
	assert.True(t, len(p1.received()) == 4 || len(p2.received()) == 4, "prefill stays: %d/%d", len(p1.received()), len(p2.received()))
	assert.True(t, len(d1.received()) == 4 || len(d2.received()) == 4, "decode stays: %d/%d", len(d1.received()), len(d2.received()))
	f.assertIdle()
}

// A LoRA request splits between a prefill and a decode worker that both
// hold its adapter; with no prefill worker holding it, it runs whole.
func TestLoRAInsideThePhasePools(t *testing.T) {
	p1, p2, d1, d2 := startEngine(t, vllmPrefill), startEngine(t, vllmPrefill), startEngine(t, sseDecode), startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, p1.URL}, {dataplane.RolePrefill, p2.URL},
		{dataplane.RoleDecode, d1.URL}, {dataplane.RoleDecode, d2.URL}}, func(c *config.Config) {
		c.Workers[1].LoRAs, c.Workers[3].LoRAs = []string{"sql"}, []string{"sql"}
		c.Workers[2].LoRAs = []string{"only-decode"}
	})
	sql := strings.Replace(pdBody, `"model":"m"`, `"model":"sql"`, 1)
	for i := 0; i < 3; i++ {
		resp := f.post("/v1/chat/completions", sql)
		assert.Equal(t, 200, resp.StatusCode)
		readAll(t, resp)
	}
	assert.Empty(t, p1.received())
	assert.Len(t, p2.received(), 3, "the prefill worker holding the adapter")
	assert.Empty(t, d1.received())
	assert.Len(t, d2.received(), 3, "the decode worker holding the adapter")

	resp := f.post("/v1/chat/completions", strings.Replace(pdBody, `"model":"m"`, `"model":"only-decode"`, 1))
	assert.Equal(t, 200, resp.StatusCode)
	readAll(t, resp)
	assert.Len(t, d1.received(), 1)
	assert.NotContains(t, d1.received()[0].body, "kv_transfer_params", "no prefill worker holds it: run whole")
	assert.EqualValues(t, 1, f.r.Frontend.Metrics().DisaggFallbacks("no_prefill_worker"))
	f.assertIdle()
}

func TestRoleThroughTheAdminAPI(t *testing.T) {
	prefill := startEngine(t, vllmPrefill)
	f := startPD(t, config.DisaggVLLM, nil, nil)
	status, body := adminDo(t, f, "POST", "/workers", `{"id":5,"url":"`+prefill.URL+`","role":"prefill"}`, "")
	assert.Equal(t, 201, status, body)
	_, body = adminDo(t, f, "GET", "/workers", "", "")
	assert.Contains(t, body, `"role":"prefill"`)
	status, body = adminDo(t, f, "POST", "/workers", `{"id":6,"url":"`+prefill.URL+`","role":"encode"}`, "")
	assert.Equal(t, 400, status)
	assert.Contains(t, body, `role: \"encode\" is not prefill, decode or both`)
}

func TestSGLangNeedsBootstrapPorts(t *testing.T) {
	cfg := config.Default()
	cfg.Router.Disaggregation.Protocol = config.DisaggSGLang
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://127.0.0.1:1", Role: dataplane.RolePrefill}}
	assert.ErrorContains(t, cfg.Validate(), "workers[0].bootstrap_port: required")
}

// The simulated engines play both SGLang roles: the decode waits on the
// prefill worker's bootstrap port until the room is prefilled.
func TestSGLangOverSimulatedEngines(t *testing.T) {
	eng := mockworker.EngineOptions{MaxNumSeqs: 4, InterTokenLatency: 2 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond}
	// The prefill engine gives no metrics: the router reads it itself.
	f := startFleet(t, []mockworker.Options{{ID: 1, Engine: eng, NoMetrics: true}, {ID: 2, Engine: eng}}, func(c *config.Config) {
		c.Router.Disaggregation.Protocol = config.DisaggSGLang
		c.Workers[0].Role, c.Workers[1].Role = dataplane.RolePrefill, dataplane.RoleDecode
		_, port, _ := strings.Cut(strings.TrimPrefix(c.Workers[0].URL, "http://"), ":")
		c.Workers[0].BootstrapPort, _ = strconv.Atoi(port) // a mock's bootstrap port is its HTTP port
	})
	prefillW, _ := f.r.Registry.Get(1)
	require.Eventually(t, prefillW.CountsTokens, 5*time.Second, 10*time.Millisecond)
	body := `{"model":"mock-model","stream":true,"max_tokens":6,"messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 100) + `"}]}`
	for i := 0; i < 4; i++ {
		resp := f.post("/v1/chat/completions", body)
		out := readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, out)
		assert.Equal(t, 6, strings.Count(out, `"content":"tok`), out)
		assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
	}
	assert.EqualValues(t, 4, f.mocks[0].Served(), "each room prefilled on the prefill engine")
	assert.EqualValues(t, 4, f.r.Frontend.Metrics().Phase("prefill", "ok"))
	f.assertIdle()
	assert.Eventually(t, func() bool { return prefillW.Relayed().Tokens == 4 }, 5*time.Second, 5*time.Millisecond,
		"each prefill's one token, from its usage")
}

// The simulated engines play both roles from the request's own fields.
func TestDisaggregationOverSimulatedEngines(t *testing.T) {
	eng := mockworker.EngineOptions{MaxNumSeqs: 4, InterTokenLatency: 2 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond}
	// Neither engine gives metrics: the router reads both itself.
	f := startFleet(t, []mockworker.Options{{ID: 1, Engine: eng, NoMetrics: true}, {ID: 2, Engine: eng, NoMetrics: true}}, func(c *config.Config) {
		c.Router.Disaggregation.Protocol = config.DisaggVLLM
		c.Workers[0].Role, c.Workers[1].Role = dataplane.RolePrefill, dataplane.RoleDecode
	})
	prefillW, _ := f.r.Registry.Get(1)
	decodeW, _ := f.r.Registry.Get(2)
	require.Eventually(t, func() bool { return prefillW.CountsTokens() && decodeW.CountsTokens() }, 5*time.Second, 10*time.Millisecond)
	body := `{"model":"mock-model","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"` + strings.Repeat("long prompt ", 100) + `"}]}`
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "http://"+f.r.Addr()+"/v1/chat/completions", strings.NewReader(body))
			resp, err := f.client.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, 200, resp.StatusCode, string(out))
			assert.Equal(t, "2", resp.Header.Get("x-fastroute-worker"))
			assert.Equal(t, 8, strings.Count(string(out), `"content":"tok`), string(out))
		}()
	}
	wg.Wait()
	f.assertIdle()
	m := f.r.Frontend.Metrics()
	assert.EqualValues(t, 8, m.Phase("prefill", "ok"))
	assert.EqualValues(t, 8, m.Phase("decode", "ok"))
	assert.Equal(t, strconv.Itoa(8), strconv.FormatInt(f.mocks[0].Served(), 10), "every prompt prefilled on the prefill engine")
	prefilled := prefillW.Relayed().Tokens
	decoded := decodeW.Relayed().Tokens
	assert.EqualValues(t, 8, prefilled, "a prefill leg's one token, from its usage")
	assert.EqualValues(t, 64, decoded, "the streams' events")
}

// The access line of a split request names the X-Request-Id both of its
// workers got: the one made up for it, or the client's.
func TestASplitRequestsAccessLineNamesItsRequestID(t *testing.T) {
	prefill, decode := startEngine(t, vllmPrefill), startEngine(t, sseDecode)
	var logs syncBuffer
	f := startFleetLog(t, nil, func(c *config.Config) {
		c.Router.Disaggregation.Protocol = config.DisaggVLLM
		c.Log.Access = "all"
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: prefill.URL, Role: dataplane.RolePrefill}, {ID: 2, URL: decode.URL, Role: dataplane.RoleDecode}}
	}, &logs)
	readAll(t, f.post("/v1/chat/completions", pdBody))
	readAll(t, f.post("/v1/chat/completions", pdBody, "X-Request-Id", "client-7"))
	got := decode.received()
	require.Len(t, got, 2)
	made := got[0].requestID
	require.True(t, strings.HasPrefix(made, "fastroute-"), made)
	assert.Equal(t, "client-7", got[1].requestID)
	// A request that would split and runs whole says why instead.
	require.NoError(t, f.r.Registry.Drain(1))
	readAll(t, f.post("/v1/chat/completions", pdBody))
	var access []string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "log=access") {
			access = append(access, l)
		}
	}
	require.Len(t, access, 3, logs.String())
	assert.Contains(t, access[0], "request_id="+made)
	assert.Contains(t, access[1], "request_id=client-7")
	for _, l := range access[:2] {
		assert.Contains(t, l, "worker=2 ")
		assert.Contains(t, l, "prefill_worker=1", "a split request's line names its prefill worker")
	}
	assert.Contains(t, access[2], "ran_whole=no_prefill_worker")
	assert.NotContains(t, access[2], "prefill_worker=")
	f.assertIdle()
}

// A reload gives a phase's pool a picker of its own from the next request
// on: round robin over the two decode workers alternates.
func TestAReloadChangesAPhasesPicker(t *testing.T) {
	prefill, decode1, decode2 := startEngine(t, vllmPrefill), startEngine(t, sseDecode), startEngine(t, sseDecode)
	f := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode1.URL},
		{dataplane.RoleDecode, decode2.URL}}, func(c *config.Config) { c.Router.Disaggregation.DecodeMode = pickers.ModeRandom })
	next := f.r.CurrentConfig()
	next.Router.Disaggregation.DecodeMode = pickers.ModeRoundRobin
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"router.disaggregation.decode_mode=round-robin"}, applied)
	assert.Empty(t, needRestart)
	var served []string
	for range 12 {
		resp := f.post("/v1/chat/completions", pdBody)
		require.Equal(t, 200, resp.StatusCode)
		readAll(t, resp)
		served = append(served, resp.Header.Get("x-fastroute-worker"))
	}
	for i := 2; i < len(served); i++ {
		assert.Equal(t, served[i-2], served[i], "round robin over two decode workers alternates: %v", served)
	}
	assert.NotEqual(t, served[0], served[1], "%v", served)
	assert.Len(t, prefill.received(), 12)
	f.assertIdle()
}

// A reload changes disaggregation's protocol from the next request on: off
// (whole), vLLM's (a prefill, then the decode with its transfer), SGLang's
// (both legs at once, meeting in a room) and off again. A request split as
// it began finishes under the protocol it began with.
func TestAReloadChangesTheDisaggregationProtocol(t *testing.T) {
	held := make(chan struct{})
	var hold atomic.Bool
	prefill := startEngine(t, func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		switch {
		case body["bootstrap_room"] != nil:
			_, _ = io.WriteString(w, `{"choices":[]}`)
		case body["kv_transfer_params"] != nil:
			if hold.Load() {
				<-held
			}
			vllmPrefill(w, r, body)
		default:
			sseDecode(w, r, body)
		}
	})
	decode := startEngine(t, sseDecode)
	f := startPD(t, config.DisaggOff, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode.URL}}, nil)
	bodies := func() (p, d []seen) { return prefill.received(), decode.received() }
	send := func() {
		t.Helper()
		resp := f.post("/v1/chat/completions", pdBody)
		require.Equal(t, 200, resp.StatusCode)
		assert.Contains(t, readAll(t, resp), "data: [DONE]")
	}
	reload := func(protocol string) {
		t.Helper()
		next := f.r.CurrentConfig()
		next.Router.Disaggregation.Protocol = protocol
		applied, needRestart, err := f.r.Reload(next)
		require.NoError(t, err)
		assert.Equal(t, []string{"router.disaggregation.protocol=" + protocol}, applied)
		assert.Empty(t, needRestart)
		assert.Equal(t, protocol, f.r.CurrentConfig().Router.Disaggregation.Protocol)
	}
	m := f.r.Frontend.Metrics()

	send()
	p, d := bodies()
	require.Len(t, append(p, d...), 1, "off: one worker took the request whole")
	assert.Nil(t, append(p, d...)[0].body["kv_transfer_params"])
	assert.EqualValues(t, 1, m.Phase("aggregated", "ok"))

	reload(config.DisaggVLLM)
	send()
	p2, d2 := bodies()
	require.Len(t, p2, len(p)+1, "vllm: a prefill leg")
	require.Len(t, d2, len(d)+1)
	assert.NotNil(t, p2[len(p)].body["kv_transfer_params"])
	assert.NotNil(t, d2[len(d)].body["kv_transfer_params"], "the decode leg with the prefill's transfer")
	assert.EqualValues(t, 1, m.Phase("prefill", "ok"))

	// Split under vLLM's protocol, then a reload to SGLang's while its
	// prefill runs: it finishes as it began.
	hold.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		send()
	}()
	require.Eventually(t, func() bool { return len(prefill.received()) == len(p2)+1 }, 5*time.Second, 5*time.Millisecond)
	reload(config.DisaggSGLang)
	close(held)
	<-done
	p3, d3 := bodies()
	require.Len(t, d3, len(d2)+1)
	assert.NotNil(t, d3[len(d2)].body["kv_transfer_params"], "the request under way kept vLLM's protocol")
	assert.EqualValues(t, 2, m.Phase("prefill", "ok"))

	send()
	p4, d4 := bodies()
	require.Len(t, p4, len(p3)+1)
	require.Len(t, d4, len(d3)+1)
	assert.NotNil(t, d4[len(d3)].body["bootstrap_room"], "sglang: a room")
	assert.Equal(t, p4[len(p3)].body, d4[len(d3)].body, "the same body to both legs")

	reload(config.DisaggOff)
	send()
	p5, d5 := bodies()
	require.Len(t, append(p5, d5...), len(p4)+len(d4)+1, "off: whole again")
	for _, b := range append(p5[len(p4):], d5[len(d4):]...) {
		assert.Nil(t, b.body["kv_transfer_params"])
		assert.Nil(t, b.body["bootstrap_room"])
	}
	assert.EqualValues(t, 2, m.Phase("aggregated", "ok"))
	f.assertIdle()
}
