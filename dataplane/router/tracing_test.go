package router

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/fastroute/fastroute/internal/otlpsink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
)

// startSink starts an OTLP receiver for the test, closed at its end.
func startSink(t *testing.T) *otlpsink.Sink {
	t.Helper()
	sink, err := otlpsink.Start()
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	return sink
}

// traceEngine answers as an engine: a stream for a stream request, a
// short chat completion otherwise.
func traceEngine(w http.ResponseWriter, r *http.Request, body map[string]any) {
	if body["stream"] == true {
		sseDecode(w, r, body)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)
}

// spanOf waits for the span of trace (hex) to reach sink and returns it.
func spanOf(t *testing.T, sink *otlpsink.Sink, trace string) otlpsink.Span {
	t.Helper()
	var found otlpsink.Span
	require.Eventually(t, func() (ok bool) {
		found, ok = sink.SpanOf(trace)
		return ok
	}, 5*time.Second, 5*time.Millisecond, "the span of trace %s reaches the collector", trace)
	return found
}

// With tracing on, a request the client traces (a sampled traceparent)
// reaches its worker as the child of the router's span, which the
// collector gets with the request's route, model, worker, status and
// steps; a request without a traceparent starts a trace at the sample
// ratio; an unsampled traceparent passes untouched and no span is made; a
// refused request's span says so. The access log names each traced
// request's trace. A reload applies a new ratio; Close sends the spans
// still queued.
func TestTracedRequestsReachTheCollector(t *testing.T) {
	sink := startSink(t)
	engine := startEngine(t, traceEngine)
	logs := &syncBuffer{}
	f := startFleetLog(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: engine.URL}}
		c.Tracing = tracing.Config{OTLPEndpoint: sink.URL(), SampleRatio: 1, ServiceName: "router-test"}
		c.Log.Access = "all"
	}, logs)
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	sentOn := func(i int) tracing.Context {
		t.Helper()
		got := engine.received()
		require.Greater(t, len(got), i)
		c, ok := tracing.Parse([]byte(got[i].traceparent))
		require.True(t, ok, "the worker gets a valid traceparent: %q", got[i].traceparent)
		return c
	}

	// The client's trace.
	code, worker, text := f.do("POST", "/v1/chat/completions", chatBody, "traceparent", "00-"+clientTrace+"-"+clientSpan+"-01")
	require.Equal(t, http.StatusOK, code, text)
	assert.Equal(t, "1", worker)
	c := sentOn(0)
	assert.Equal(t, clientTrace, hex.EncodeToString(c.Trace[:]), "in the client's trace")
	assert.NotEqual(t, clientSpan, hex.EncodeToString(c.Span[:]), "the worker's parent is the router's span")
	assert.True(t, c.Sampled)
	s := spanOf(t, sink, clientTrace)
	assert.Equal(t, c.Span[:], s.SpanId, "the span the worker's traceparent names")
	assert.Equal(t, clientSpan, hex.EncodeToString(s.ParentSpanId))
	assert.Equal(t, "router-test", s.Service)
	assert.Equal(t, "POST /v1/chat/completions", s.Name)
	assert.Equal(t, tracepb.Span_SPAN_KIND_SERVER, s.Kind)
	for key, want := range map[string]any{
		"http.request.method": "POST", "http.route": "/v1/chat/completions", "http.response.status_code": int64(200),
		"gen_ai.request.model": "mock-model", "fastroute.outcome": "ok", "fastroute.worker.id": int64(1),
		"fastroute.attempts": int64(1), "fastroute.stream": false, "client.address": "127.0.0.1",
	} {
		assert.Equal(t, want, s.Attr(key), key)
	}
	assert.Greater(t, s.Attr("client.port"), int64(0))
	var events []string
	for _, e := range s.Events {
		events = append(events, e.Name)
		assert.GreaterOrEqual(t, e.TimeUnixNano, s.StartTimeUnixNano)
		assert.LessOrEqual(t, e.TimeUnixNano, s.EndTimeUnixNano)
	}
	assert.Equal(t, []string{"worker_picked", "sent_to_worker", "first_byte"}, events)
	assert.Nil(t, s.Status)

	// A stream without a traceparent: a trace of its own.
	resp, text := f.send("POST", "/v1/chat/completions", streamBody)
	require.Equal(t, http.StatusOK, resp.StatusCode, text)
	require.Contains(t, text, "[DONE]")
	c = sentOn(1)
	s = spanOf(t, sink, hex.EncodeToString(c.Trace[:]))
	assert.Equal(t, c.Span[:], s.SpanId)
	assert.Empty(t, s.ParentSpanId, "the trace starts at the router")
	assert.Equal(t, true, s.Attr("fastroute.stream"))
	events = events[:0]
	for _, e := range s.Events {
		events = append(events, e.Name)
	}
	assert.Equal(t, []string{"worker_picked", "sent_to_worker", "first_byte", "first_token"}, events)
	streamTrace := hex.EncodeToString(c.Trace[:])

	// An unsampled traceparent passes as it came, and makes no span.
	unsampled := "00-" + strings.Repeat("ab", 16) + "-" + clientSpan + "-00"
	code, _, _ = f.do("POST", "/v1/chat/completions", chatBody, "traceparent", unsampled)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, unsampled, engine.received()[2].traceparent)

	// A refused request is traced too.
	badTrace := strings.Repeat("cd", 16)
	code, _, _ = f.do("POST", "/v1/chat/completions", `{"model":`, "traceparent", "00-"+badTrace+"-"+clientSpan+"-01")
	require.Equal(t, http.StatusBadRequest, code)
	s = spanOf(t, sink, badTrace)
	assert.Equal(t, int64(400), s.Attr("http.response.status_code"))
	assert.Equal(t, "invalid", s.Attr("fastroute.outcome"))
	assert.Nil(t, s.Attr("fastroute.worker.id"), "no worker picked")
	assert.Nil(t, s.Status, "a client's error is not the server's")
	assert.Len(t, engine.received(), 3)

	require.Eventually(t, func() bool {
		return metric(t, f, `fastroute_trace_spans_total{outcome="exported"}`) == "3"
	}, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, "1", metric(t, f, "fastroute_trace_sample_ratio"))
	log := logs.String()
	for _, trace := range []string{clientTrace, streamTrace, badTrace} {
		assert.Contains(t, log, "trace_id="+trace, "the access log names the trace")
	}
	assert.NotContains(t, log, "trace_id="+strings.Repeat("ab", 16), "an untraced request has no trace id")
	f.assertIdle()

	// A reload applies a new ratio.
	next := f.r.CurrentConfig()
	next.Tracing.SampleRatio = 0
	applied, needRestart, err := f.r.Reload(next)
	require.NoError(t, err)
	assert.Equal(t, []string{"tracing.sample_ratio=0"}, applied)
	assert.Empty(t, needRestart)
	code, _, _ = f.do("POST", "/v1/chat/completions", chatBody)
	require.Equal(t, http.StatusOK, code)
	assert.Empty(t, engine.received()[3].traceparent, "ratio 0: not traced")

	// Close sends what is still queued.
	lastTrace := strings.Repeat("ef", 16)
	code, _, _ = f.do("POST", "/v1/chat/completions", chatBody, "traceparent", "00-"+lastTrace+"-"+clientSpan+"-01")
	require.Equal(t, http.StatusOK, code)
	require.NoError(t, f.r.Close())
	spanOf(t, sink, lastTrace)
	assert.Len(t, sink.Spans(), 4)
}

// A reload turns tracing on, moves it to another collector (a new
// endpoint, service name and headers: the spans ended from then on go
// there, the old collector gets the ones it was sent before), and turns it
// off: a traceparent passes untouched again, and the spans' metrics go.
func TestAReloadMovesTracing(t *testing.T) {
	first := startSink(t)
	second := startSink(t)
	engine := startEngine(t, traceEngine)
	f := startFleet(t, nil, func(c *config.Config) {
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: engine.URL}}
	})
	const clientSpan = "00f067aa0ba902b7"
	traced := func(trace string) string {
		t.Helper()
		code, _, text := f.do("POST", "/v1/chat/completions", chatBody, "traceparent", "00-"+trace+"-"+clientSpan+"-01")
		require.Equal(t, http.StatusOK, code, text)
		got := engine.received()
		return got[len(got)-1].traceparent
	}
	reload := func(tc tracing.Config) []string {
		t.Helper()
		applied, err := f.reloaded(func(c *config.Config) { c.Tracing = tc })
		require.NoError(t, err)
		assert.Equal(t, tc, f.r.CurrentConfig().Tracing)
		return applied
	}

	off := strings.Repeat("a1", 16)
	assert.Equal(t, "00-"+off+"-"+clientSpan+"-01", traced(off), "off: the traceparent passes untouched")
	assert.Empty(t, metric(t, f, `fastroute_trace_spans_total{outcome="dropped"}`))

	applied := reload(tracing.Config{OTLPEndpoint: first.URL(), SampleRatio: 1, ServiceName: "router-test"})
	assert.Equal(t, []string{"tracing to " + first.URL() + " (service_name router-test, 0 headers, sample_ratio 1)"}, applied)
	on := strings.Repeat("b2", 16)
	assert.NotContains(t, traced(on), clientSpan, "on: the worker's parent is the router's span")
	assert.Equal(t, "router-test", spanOf(t, first, on).Service)

	// A new collector, service name and headers; the endpoint's password
	// is not said.
	secondURL := strings.Replace(second.URL(), "http://", "http://user:hunter2@", 1)
	applied = reload(tracing.Config{OTLPEndpoint: secondURL, SampleRatio: 1, ServiceName: "moved",
		Headers: map[string]string{"Authorization": "Bearer hunter2"}})
	require.Len(t, applied, 1)
	assert.Contains(t, applied[0], "tracing to http://user:xxxxx@127.0.0.1:")
	assert.Contains(t, applied[0], "(service_name moved, 1 headers, sample_ratio 1)")
	assert.NotContains(t, applied[0], "hunter2")
	moved := strings.Repeat("c3", 16)
	assert.NotContains(t, traced(moved), clientSpan)
	s := spanOf(t, second, moved)
	assert.Equal(t, "moved", s.Service)
	assert.Equal(t, "Bearer hunter2", second.Header("Authorization"))
	_, elsewhere := first.SpanOf(moved)
	assert.False(t, elsewhere, "the old collector gets no span ended after the reload")
	assert.Len(t, first.Spans(), 1)
	require.Eventually(t, func() bool {
		return metric(t, f, `fastroute_trace_spans_total{outcome="exported"}`) == "2"
	}, 5*time.Second, 5*time.Millisecond, "the counts run on over the collectors")

	applied = reload(tracing.Config{SampleRatio: 1, ServiceName: "moved"})
	assert.Equal(t, []string{"tracing off"}, applied)
	applied = reload(tracing.Config{SampleRatio: 0.5, ServiceName: "moved"})
	assert.Equal(t, []string{"tracing stays off (sample_ratio 0.5, service_name moved)"}, applied)
	offAgain := strings.Repeat("d4", 16)
	assert.Equal(t, "00-"+offAgain+"-"+clientSpan+"-01", traced(offAgain), "off again: untouched")
	assert.Empty(t, metric(t, f, `fastroute_trace_spans_total{outcome="dropped"}`))
	time.Sleep(300 * time.Millisecond) // past an export interval
	assert.Len(t, second.Spans(), 1)
	f.assertIdle()
}

// Both legs of a split request, and a mirror's copy beside the request
// itself, go on as children of the router's span.
func TestSplitLegsAndMirrorCopiesCarryTheRoutersSpan(t *testing.T) {
	sink := startSink(t)
	traceOn := func(c *config.Config) {
		c.Tracing = tracing.Config{OTLPEndpoint: sink.URL(), SampleRatio: 0, ServiceName: "router-test"}
	}
	clientParent := func(trace string) string { return "00-" + trace + "-00f067aa0ba902b7-01" }
	assertChild := func(traceparent, trace string, span []byte, leg string) {
		t.Helper()
		c, ok := tracing.Parse([]byte(traceparent))
		require.True(t, ok, "%s: %q", leg, traceparent)
		assert.Equal(t, trace, hex.EncodeToString(c.Trace[:]), leg)
		assert.Equal(t, span, c.Span[:], "%s: the router's span is the parent", leg)
	}

	prefill, decode := startEngine(t, vllmPrefill), startEngine(t, sseDecode)
	pd := startPD(t, config.DisaggVLLM, []pdWorker{{dataplane.RolePrefill, prefill.URL}, {dataplane.RoleDecode, decode.URL}}, traceOn)
	splitTrace := strings.Repeat("12", 16)
	readAll(t, pd.post("/v1/chat/completions", pdBody, "traceparent", clientParent(splitTrace)))
	span := spanOf(t, sink, splitTrace).SpanId
	require.Len(t, prefill.received(), 1)
	require.Len(t, decode.received(), 1)
	assertChild(prefill.received()[0].traceparent, splitTrace, span, "prefill leg")
	assertChild(decode.received()[0].traceparent, splitTrace, span, "decode leg")
	assertPrefill := func(trace string) {
		t.Helper()
		s := spanOf(t, sink, trace)
		assert.Equal(t, int64(1), s.Attr("fastroute.prefill.worker.id"))
		assert.Equal(t, int64(2), s.Attr("fastroute.worker.id"), "the decode worker answered")
		var events []string
		for _, e := range s.Events {
			events = append(events, e.Name)
		}
		assert.Subset(t, events, []string{"prefill_done", "sent_to_worker", "first_byte", "first_token"})
	}
	assertPrefill(splitTrace)
	pd.assertIdle()

	// SGLang's prefill leg runs beside the decode leg, on a goroutine of
	// its own: its end reaches the span too (under -race: no race).
	sglPrefill := startEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})
	sglDecode := startEngine(t, sseDecode)
	sgl := startPD(t, config.DisaggSGLang, []pdWorker{{dataplane.RolePrefill, sglPrefill.URL}, {dataplane.RoleDecode, sglDecode.URL}}, traceOn)
	sglTrace := strings.Repeat("56", 16)
	readAll(t, sgl.post("/v1/chat/completions", pdBody, "traceparent", clientParent(sglTrace)))
	assertPrefill(sglTrace)
	sgl.assertIdle()

	production, shadow := startEngine(t, traceEngine), startEngine(t, traceEngine)
	f := startFleet(t, nil, func(c *config.Config) {
		traceOn(c)
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: production.URL, Models: []string{"llama"}},
			{ID: 2, URL: shadow.URL, Models: []string{"llama-next"}}}
		c.ModelMirrors = []mirrors.Mirror{{Model: "llama", To: "llama-next", Percent: 100}}
	})
	mirrorTrace := strings.Repeat("34", 16)
	code, worker, text := f.do("POST", "/v1/chat/completions", `{"model":"llama","messages":[]}`, "traceparent", clientParent(mirrorTrace))
	require.Equal(t, http.StatusOK, code, text)
	assert.Equal(t, "1", worker)
	span = spanOf(t, sink, mirrorTrace).SpanId
	require.Eventually(t, func() bool { return len(shadow.received()) == 1 }, 5*time.Second, 5*time.Millisecond)
	assertChild(production.received()[0].traceparent, mirrorTrace, span, "the request")
	assertChild(shadow.received()[0].traceparent, mirrorTrace, span, "the mirror's copy")
	f.assertIdle()
}

// A traced request's span shows each try that moved it on: a worker that
// refused the connection (connect), one that answered a status of
// router.retry_statuses (status, with the status), each naming its worker.
func TestATracedRequestsSpanShowsItsMoves(t *testing.T) {
	sink := startSink(t)
	busy := startEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		http.Error(w, `{"error":"busy"}`, http.StatusServiceUnavailable)
	})
	good := startEngine(t, traceEngine)
	f := startFleet(t, nil, func(c *config.Config) {
		c.Tracing = tracing.Config{OTLPEndpoint: sink.URL(), SampleRatio: 1, ServiceName: "router-test"}
		c.Workers = []dataplane.WorkerSpec{{ID: 1, URL: "http://" + deadAddr(t)}, {ID: 2, URL: busy.URL}, {ID: 3, URL: good.URL}}
		c.Router.RetryStatuses = []int{http.StatusServiceUnavailable}
		c.Health.EjectAfter = 1000
	})
	// Round-robin puts each worker first in turn: a few requests meet both.
	moves := map[string]int64{} // reason → the worker it named
	for i := 0; i < 12 && len(moves) < 2; i++ {
		trace := strings.Repeat(fmt.Sprintf("%02d", 50+i), 16)
		code, worker, text := f.do("POST", "/v1/chat/completions", chatBody, "traceparent", "00-"+trace+"-00f067aa0ba902b7-01")
		require.Equal(t, http.StatusOK, code, text)
		require.Equal(t, "3", worker)
		s := spanOf(t, sink, trace)
		n := int64(0)
		for _, e := range s.Events {
			if e.Name != "moved_on" {
				continue
			}
			n++
			reason := otlpsink.Attr(e.Attributes, "fastroute.move.reason").(string)
			moves[reason] = otlpsink.Attr(e.Attributes, "fastroute.worker.id").(int64)
			if reason == "status" {
				assert.Equal(t, int64(503), otlpsink.Attr(e.Attributes, "http.response.status_code"))
			}
			assert.Greater(t, e.TimeUnixNano, s.StartTimeUnixNano)
		}
		assert.Equal(t, n+1, s.Attr("fastroute.attempts"), "a move for each try but the last")
		assert.Equal(t, int64(3), s.Attr("fastroute.worker.id"))
	}
	assert.Equal(t, map[string]int64{"connect": 1, "status": 2}, moves)
	f.assertIdle()
}
