package tracing

import (
	"context"
	"encoding/hex"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/internal/otlpsink"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// startSink starts an OTLP receiver for the test, closed at its end.
func startSink(t *testing.T) *otlpsink.Sink {
	t.Helper()
	sink, err := otlpsink.Start()
	require.NoError(t, err)
	t.Cleanup(func() { sink.Close() })
	return sink
}

const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
)

// Parse takes the W3C Trace Context's traceparent values and no others;
// Append writes what Parse reads back.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		value   string
		ok      bool
		sampled bool
	}{
		{"00-" + clientTrace + "-" + clientSpan + "-01", true, true},
		{"00-" + clientTrace + "-" + clientSpan + "-00", true, false},
		{"00-" + clientTrace + "-" + clientSpan + "-03", true, true},                 // other flags beside sampled
		{"cc-" + clientTrace + "-" + clientSpan + "-01-what-comes-next", true, true}, // a later version's, read as 00's
		{"cc-" + clientTrace + "-" + clientSpan + "-01", true, true},
		{"cc-" + clientTrace + "-" + clientSpan + "-01x", false, false}, // a later version's extra needs its dash
		{"00-" + clientTrace + "-" + clientSpan + "-01-", false, false}, // version 00 is exactly 55 bytes
		{"ff-" + clientTrace + "-" + clientSpan + "-01", false, false},  // version ff is invalid
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-" + clientSpan + "-01", false, false},
		{"00-00000000000000000000000000000000-" + clientSpan + "-01", false, false},
		{"00-" + clientTrace + "-0000000000000000-01", false, false},
		{"00-" + clientTrace + "-" + clientSpan + "-0g", false, false},
		{"00_" + clientTrace + "-" + clientSpan + "-01", false, false},
		{"00-" + clientTrace[:31] + "-" + clientSpan + "-01", false, false},
		{"", false, false},
		{"garbage", false, false},
	} {
		c, ok := Parse([]byte(tc.value))
		require.Equal(t, tc.ok, ok, tc.value)
		if !ok {
			continue
		}
		assert.Equal(t, tc.sampled, c.Sampled, tc.value)
		assert.Equal(t, clientTrace, hex.EncodeToString(c.Trace[:]))
		assert.Equal(t, clientSpan, hex.EncodeToString(c.Span[:]))
		back, ok := Parse(c.Append(nil))
		require.True(t, ok)
		assert.Equal(t, c, back)
	}
	c, _ := Parse([]byte("00-" + clientTrace + "-" + clientSpan + "-03"))
	assert.Equal(t, "00-"+clientTrace+"-"+clientSpan+"-01", string(c.Append(nil)), "the router sends version 00 with the sampled flag alone")
}

func newTracer(t *testing.T, endpoint string, ratio float64, opts Options) *Tracer {
	t.Helper()
	tr, err := New(Config{OTLPEndpoint: endpoint, SampleRatio: ratio, ServiceName: "fastroute-test"}, opts)
	require.NoError(t, err)
	return tr
}

// A valid traceparent decides by its sampled flag (parent-based); a
// request without one, or with an invalid one, starts a trace at the
// sample ratio: OpenTelemetry's TraceIDRatioBased over the new trace id.
func TestBeginSamples(t *testing.T) {
	tr := newTracer(t, "http://127.0.0.1:1/v1/traces", 0, Options{})
	var s Span
	start := time.Now()
	sampled := []byte("00-" + clientTrace + "-" + clientSpan + "-01")
	require.True(t, tr.Begin(&s, sampled, start), "a sampled parent is traced at ratio 0")
	assert.Equal(t, clientTrace, hex.EncodeToString(s.Trace[:]), "in the client's trace")
	assert.Equal(t, clientSpan, hex.EncodeToString(s.Parent[:]), "a child of the client's span")
	assert.NotEqual(t, SpanID{}, s.Span)
	assert.NotEqual(t, s.Parent, s.Span)
	assert.True(t, s.Sampled)
	assert.Equal(t, start, s.Start)
	assert.False(t, tr.Begin(&s, nil, start), "ratio 0: no new trace")
	assert.False(t, tr.Begin(&s, []byte("garbage"), start))

	tr.SetSampleRatio(1)
	assert.InDelta(t, 1, tr.SampleRatio(), 1e-9)
	assert.False(t, tr.Begin(&s, []byte("00-"+clientTrace+"-"+clientSpan+"-00"), start), "an unsampled parent is not traced at ratio 1")
	require.True(t, tr.Begin(&s, []byte("garbage"), start), "an invalid traceparent counts as none")
	assert.Equal(t, SpanID{}, s.Parent, "a new trace's root")
	assert.NotEqual(t, clientTrace, hex.EncodeToString(s.Trace[:]))
	first := s.Trace
	require.True(t, tr.Begin(&s, nil, start))
	assert.NotEqual(t, first, s.Trace, "each request starts its own trace")

	tr.SetSampleRatio(0.25)
	in := 0
	const draws = 40000
	for range draws {
		if tr.Begin(&s, nil, start) {
			in++
			assert.Less(t, s.Trace[8], uint8(0x40), "a sampled id's low 8 bytes, less their lowest bit, fall under 0.25·2⁶³")
		}
	}
	assert.InDelta(t, 0.25, float64(in)/draws, 0.02)
	tr.SetSampleRatio(7)
	assert.InDelta(t, 1, tr.SampleRatio(), 1e-9, "a ratio is at most 1")
}

// A bad tracing config is refused, naming the key.
func TestConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		cfg Config
		key string
	}{
		{Config{SampleRatio: -0.1}, "sample_ratio"},
		{Config{SampleRatio: 1.5, OTLPEndpoint: "http://c:4318"}, "sample_ratio"},
		{Config{SampleRatio: 1, OTLPEndpoint: "collector:4317", ServiceName: "s"}, "otlp_endpoint"},
		{Config{SampleRatio: 1, OTLPEndpoint: "grpc://c:4317", ServiceName: "s"}, "otlp_endpoint"},
		{Config{SampleRatio: 1, OTLPEndpoint: "http://", ServiceName: "s"}, "otlp_endpoint"},
		{Config{SampleRatio: 1, OTLPEndpoint: "http://c:4318"}, "service_name"},
	} {
		key, err := tc.cfg.Check()
		assert.Error(t, err, "%+v", tc.cfg)
		assert.Equal(t, tc.key, key, "%+v", tc.cfg)
	}
	_, err := Config{SampleRatio: 1}.Check()
	assert.NoError(t, err, "off")
	_, err = New(Config{SampleRatio: 1, OTLPEndpoint: "http://user:secret@c:4318/\x7f", ServiceName: "s"}, Options{})
	if assert.Error(t, err) {
		assert.NotContains(t, err.Error(), "secret", "a URL's password is never quoted")
	}
	for endpoint, want := range map[string]string{
		"http://c:4318":               "http://c:4318/v1/traces",
		"https://c:4318/":             "https://c:4318/v1/traces",
		"http://c:4318/otlp/traces":   "http://c:4318/otlp/traces",
		"http://u:p@c:4318/v1/traces": "http://u:p@c:4318/v1/traces",
	} {
		got, err := exportURL(endpoint)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
}

// Begin and End allocate nothing: a traced request costs the request path
// no allocation.
func TestBeginAndEndDoNotAllocate(t *testing.T) {
	tr := newTracer(t, "http://127.0.0.1:1/v1/traces", 1, Options{QueueSize: 4})
	var s Span
	parent := []byte("00-" + clientTrace + "-" + clientSpan + "-01")
	var buf []byte
	allocs := testing.AllocsPerRun(1000, func() {
		if tr.Begin(&s, parent, time.Now()) {
			s.SetModel([]byte("mock-model"))
			buf = s.Context.Append(buf[:0])
			tr.End(&s)
		}
		if tr.Begin(&s, nil, time.Now()) {
			tr.End(&s)
		}
	})
	assert.Zero(t, allocs)
	_, dropped, _ := tr.Counts()
	assert.Positive(t, dropped, "the queue of 4, never sent, is full")
}

// The spans go to a collector over OTLP/HTTP, a batch a post, as
// OpenTelemetry's conventions name their fields; a collector that refuses
// them or is gone counts them failed; a full queue drops them; Close sends
// what is queued.
func TestSpansReachTheCollector(t *testing.T) {
	sink := startSink(t)
	tr, err := New(Config{OTLPEndpoint: sink.URL(), SampleRatio: 1, ServiceName: "fastroute-test",
		Headers: map[string]string{"authorization": "Bearer collector-token"}}, Options{Interval: 10 * time.Millisecond, BatchSize: 2})
	require.NoError(t, err)
	defer tr.Close(context.Background())

	start := time.Now()
	var s Span
	require.True(t, tr.Begin(&s, []byte("00-"+clientTrace+"-"+clientSpan+"-01"), start))
	s.Name, s.Method, s.Route = "POST /v1/chat/completions", "POST", "/v1/chat/completions"
	s.Duration, s.Status, s.Outcome, s.Worker, s.Attempts, s.Stream = 40*time.Millisecond, 200, "ok", 3, 2, true
	s.Picked, s.Sent, s.FirstByte, s.FirstToken = 500*time.Microsecond, time.Millisecond, 5*time.Millisecond, 9*time.Millisecond
	s.InputTokens, s.OutputTokens = 12, 34
	s.SetModel([]byte("mock-model"))
	tr.End(&s)
	own := s.Span
	require.True(t, tr.Begin(&s, nil, start))
	s.Name, s.Method, s.Duration, s.Status, s.Outcome = "POST", "POST", time.Millisecond, 502, "upstream_error"
	tr.End(&s)
	require.True(t, tr.Begin(&s, nil, start))
	s.Name, s.Status, s.Outcome = "GET", 404, "invalid"
	tr.End(&s)

	tr.Start() // the three spans queued: two posts
	require.Eventually(t, func() bool { e, _, _ := tr.Counts(); return e == 3 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 2, sink.Posts(), "batches of at most 2")
	assert.Equal(t, "Bearer collector-token", sink.Header("Authorization"), "the config's headers go with each post")
	assert.Equal(t, "application/x-protobuf", sink.Header("Content-Type"))
	got := sink.Spans()
	ok := got[0]
	assert.Equal(t, "fastroute-test", ok.Service)
	assert.Equal(t, clientTrace, hex.EncodeToString(ok.TraceId))
	assert.Equal(t, clientSpan, hex.EncodeToString(ok.ParentSpanId))
	assert.Equal(t, own[:], ok.SpanId)
	assert.Equal(t, "POST /v1/chat/completions", ok.Name)
	assert.Equal(t, tracepb.Span_SPAN_KIND_SERVER, ok.Kind)
	assert.Equal(t, uint64(start.UnixNano()), ok.StartTimeUnixNano)
	assert.Equal(t, uint64(start.Add(40*time.Millisecond).UnixNano()), ok.EndTimeUnixNano)
	assert.Equal(t, uint32(0x301), ok.Flags, "sampled, its parent remote")
	for key, want := range map[string]any{
		"http.request.method": "POST", "http.route": "/v1/chat/completions", "http.response.status_code": int64(200),
		"gen_ai.request.model": "mock-model", "gen_ai.usage.input_tokens": int64(12), "gen_ai.usage.output_tokens": int64(34),
		"fastroute.outcome": "ok", "fastroute.worker.id": int64(3), "fastroute.attempts": int64(2), "fastroute.stream": true,
	} {
		assert.Equal(t, want, ok.Attr(key), key)
	}
	require.Len(t, ok.Events, 4)
	for i, want := range []struct {
		name string
		at   time.Duration
	}{{"worker_picked", 500 * time.Microsecond}, {"sent_to_worker", time.Millisecond}, {"first_byte", 6 * time.Millisecond}, {"first_token", 9 * time.Millisecond}} {
		assert.Equal(t, want.name, ok.Events[i].Name)
		assert.Equal(t, uint64(start.Add(want.at).UnixNano()), ok.Events[i].TimeUnixNano, want.name)
	}
	assert.Nil(t, ok.Status, "no error: status unset")

	failed := got[1]
	assert.Empty(t, failed.ParentSpanId, "a root")
	assert.Equal(t, uint32(0x101), failed.Flags)
	assert.Equal(t, tracepb.Status_STATUS_CODE_ERROR, failed.Status.GetCode())
	assert.Equal(t, "upstream_error", failed.Status.GetMessage())
	assert.Nil(t, failed.Attr("http.route"))
	assert.Nil(t, failed.Attr("gen_ai.request.model"), "no model named")
	assert.Nil(t, failed.Attr("fastroute.worker.id"), "none picked")
	assert.Empty(t, failed.Events)
	exported, dropped, fails := tr.Counts()
	assert.Equal(t, [3]uint64{3, 0, 0}, [3]uint64{exported, dropped, fails})

	sink.SetStatus(http.StatusServiceUnavailable)
	tr.End(&s)
	require.Eventually(t, func() bool { _, _, f := tr.Counts(); return f == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Len(t, sink.Spans(), 3, "not retried")

	text := metrics.Text(tr.Collector())
	assert.Contains(t, text, `fastroute_trace_spans_total{outcome="exported"} 3`)
	assert.Contains(t, text, `fastroute_trace_spans_total{outcome="failed"} 1`)
	assert.Contains(t, text, `fastroute_trace_sample_ratio 1`)
}

// A span that finds the queue full is dropped and counted; Close sends
// the queued ones, and a collector that is gone fails them.
func TestCloseSendsTheQueue(t *testing.T) {
	sink := startSink(t)
	tr := newTracer(t, sink.URL(), 1, Options{QueueSize: 2, Interval: time.Hour})
	tr.Start()
	var s Span
	for range 5 {
		require.True(t, tr.Begin(&s, nil, time.Now()))
		tr.End(&s)
	}
	tr.Close(context.Background())
	assert.Len(t, sink.Spans(), 2)
	exported, dropped, failed := tr.Counts()
	assert.Equal(t, [3]uint64{2, 3, 0}, [3]uint64{exported, dropped, failed})

	gone := newTracer(t, sink.URL(), 1, Options{Timeout: time.Second})
	require.NoError(t, sink.Close())
	require.True(t, gone.Begin(&s, nil, time.Now()))
	gone.End(&s)
	gone.Close(context.Background())
	_, _, failed = gone.Counts()
	assert.Equal(t, uint64(1), failed)
}

// Configure moves the export to a new collector: the spans ended before
// go to the old one (its export sends what it holds once replaced, before
// its interval), those after to the new one with its service name; a new
// ratio alone keeps the export; a config that is off turns tracing off
// (End counts a span dropped) and one that is refused changes nothing.
// The counts run on over the collectors.
func TestConfigureMovesTheExport(t *testing.T) {
	first := startSink(t)
	second := startSink(t)
	tr := newTracer(t, first.URL(), 1, Options{Interval: time.Hour})
	tr.Start()
	var s Span
	end := func() string {
		require.True(t, tr.On())
		require.True(t, tr.Begin(&s, nil, time.Now()))
		tr.End(&s)
		return hex.EncodeToString(s.Trace[:])
	}
	before := end()
	exp := tr.exp.Load()
	require.NoError(t, tr.Configure(Config{OTLPEndpoint: first.URL(), SampleRatio: 0.5, ServiceName: "fastroute-test"}))
	assert.Same(t, exp, tr.exp.Load(), "a new ratio alone keeps the export")
	assert.InDelta(t, 0.5, tr.SampleRatio(), 1e-9)

	require.NoError(t, tr.Configure(Config{OTLPEndpoint: second.URL(), SampleRatio: 1, ServiceName: "moved"}))
	require.Eventually(t, func() bool { _, ok := first.SpanOf(before); return ok }, 5*time.Second, 5*time.Millisecond,
		"the replaced export sends what it holds")
	after := end()
	err := tr.Configure(Config{OTLPEndpoint: "grpc://c:4317", SampleRatio: 1, ServiceName: "s"})
	assert.ErrorContains(t, err, "tracing.otlp_endpoint")
	require.NoError(t, tr.Configure(Config{SampleRatio: 1}))
	assert.False(t, tr.On())
	assert.Empty(t, metrics.Text(tr.Collector()), "off: no metrics")
	tr.End(&s) // a span begun before tracing turned off
	tr.Close(context.Background())

	got, ok := second.SpanOf(after)
	require.True(t, ok, "the new collector gets the spans ended after the move")
	assert.Equal(t, "moved", got.Service)
	assert.Len(t, first.Spans(), 1)
	assert.Len(t, second.Spans(), 1)
	exported, dropped, failed := tr.Counts()
	assert.Equal(t, [3]uint64{2, 1, 0}, [3]uint64{exported, dropped, failed})
}

// Requests begin and end spans while Configure moves the export between
// two collectors and turns it off and on: under -race nothing races, and
// every span ended is counted at most once (one ended as its export is
// replaced may be lost: Configure's doc).
func TestConfigureRacesTheRequests(t *testing.T) {
	var sinks [2]*otlpsink.Sink
	for i := range sinks {
		s := startSink(t)
		sinks[i] = s
	}
	tr := newTracer(t, sinks[0].URL(), 1, Options{Interval: time.Millisecond})
	tr.Start()
	var ended atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var s Span
			for {
				select {
				case <-stop:
					return
				default:
				}
				if tr.On() && tr.Begin(&s, nil, time.Now()) {
					tr.End(&s)
					ended.Add(1)
				}
				time.Sleep(20 * time.Microsecond) // a few thousand spans in all
			}
		})
	}
	for i := range 60 {
		cfg := Config{OTLPEndpoint: sinks[i%2].URL(), SampleRatio: 1, ServiceName: "s"}
		if i%3 == 2 {
			cfg.OTLPEndpoint = ""
		}
		require.NoError(t, tr.Configure(cfg))
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	tr.Close(context.Background())
	exported, dropped, failed := tr.Counts()
	assert.Positive(t, exported)
	assert.LessOrEqual(t, exported+dropped+failed, uint64(ended.Load()))
	assert.Equal(t, int(exported), len(sinks[0].Spans())+len(sinks[1].Spans()))
}

func BenchmarkBeginEnd(b *testing.B) {
	tr, err := New(Config{OTLPEndpoint: "http://127.0.0.1:1", SampleRatio: 1, ServiceName: "b"}, Options{QueueSize: 1 << 16})
	require.NoError(b, err)
	parent := []byte("00-" + clientTrace + "-" + clientSpan + "-01")
	var s Span
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		tr.Begin(&s, parent, time.Now())
		buf = s.Context.Append(buf[:0])
		s.SetModel([]byte("mock-model"))
		tr.End(&s)
		if _, ok := tr.exp.Load().queue.TryDequeue(); !ok {
			b.Fatal("not queued")
		}
	}
}

// A span keeps its first eight moves.
func TestASpanKeepsItsFirstMoves(t *testing.T) {
	var s Span
	for i := range 10 {
		s.AddMove(Move{Worker: uint64(i + 1), Reason: "connect"})
	}
	require.Equal(t, uint8(maxMoves), s.nMoves)
	assert.Equal(t, uint64(8), s.moves[7].Worker)
}

// The encoder writes what OpenTelemetry's own generated types read back
// as the same message, field for field, with nothing left unknown.
func TestTheEncodingIsOTLPs(t *testing.T) {
	start := time.Unix(1700000000, 123)
	full := Span{Context: Context{Trace: TraceID{1, 2, 3}, Span: SpanID{4, 5}, Sampled: true}, Parent: SpanID{6},
		Name: "POST /v1/chat/completions", Method: "POST", Route: "/v1/chat/completions", Start: start,
		Duration: 40 * time.Millisecond, Status: 503, Outcome: "upstream_error", Worker: 300, Attempts: 3,
		Stream: true, Picked: time.Microsecond, Sent: time.Millisecond, FirstByte: 2 * time.Millisecond, FirstToken: 5 * time.Millisecond,
		InputTokens: 1 << 20, OutputTokens: 7, PrefillWorker: 9, Prefilled: 800 * time.Microsecond,
		Client: netip.MustParseAddrPort("[2001:db8::5]:4444")}
	full.SetModel([]byte(strings.Repeat("m", 200)))
	full.AddMove(Move{At: 300 * time.Microsecond, Worker: 7, Reason: "connect"})
	full.AddMove(Move{At: 700 * time.Microsecond, Worker: 8, Reason: "status", Status: 503})
	bare := Span{Context: Context{Trace: TraceID{9}, Span: SpanID{8}, Sampled: true}, Name: "GET", Method: "GET",
		Start: start, Status: 401, Outcome: "invalid"}
	got := &coltracepb.ExportTraceServiceRequest{}
	require.NoError(t, proto.Unmarshal(newEncoder("svc").request([]Span{full, bare}), got))

	str := func(k, v string) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
	}
	num := func(k string, v int64) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
	}
	flag := func(k string, v bool) *commonpb.KeyValue {
		return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v}}}
	}
	at := func(d time.Duration) uint64 { return uint64(start.Add(d).UnixNano()) }
	want := &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{str("service.name", "svc"), str("telemetry.sdk.name", "fastroute")}},
		ScopeSpans: []*tracepb.ScopeSpans{{
			Scope: &commonpb.InstrumentationScope{Name: "github.com/fastroute/fastroute"},
			Spans: []*tracepb.Span{{
				TraceId: full.Trace[:], SpanId: full.Span[:], ParentSpanId: full.Parent[:], Name: full.Name,
				Kind: tracepb.Span_SPAN_KIND_SERVER, StartTimeUnixNano: at(0), EndTimeUnixNano: at(40 * time.Millisecond),
				Attributes: []*commonpb.KeyValue{str("http.request.method", "POST"), num("http.response.status_code", 503),
					str("http.route", "/v1/chat/completions"), str("gen_ai.request.model", strings.Repeat("m", maxModel)),
					num("gen_ai.usage.input_tokens", 1<<20), num("gen_ai.usage.output_tokens", 7),
					str("client.address", "2001:db8::5"), num("client.port", 4444),
					str("fastroute.outcome", "upstream_error"), num("fastroute.worker.id", 300), num("fastroute.prefill.worker.id", 9),
					num("fastroute.attempts", 3),
					flag("fastroute.stream", true)},
				Events: []*tracepb.Span_Event{{Name: "worker_picked", TimeUnixNano: at(time.Microsecond)},
					{Name: "moved_on", TimeUnixNano: at(300 * time.Microsecond), Attributes: []*commonpb.KeyValue{
						num("fastroute.worker.id", 7), str("fastroute.move.reason", "connect")}},
					{Name: "moved_on", TimeUnixNano: at(700 * time.Microsecond), Attributes: []*commonpb.KeyValue{
						num("fastroute.worker.id", 8), str("fastroute.move.reason", "status"), num("http.response.status_code", 503)}},
					{Name: "prefill_done", TimeUnixNano: at(800 * time.Microsecond)},
					{Name: "sent_to_worker", TimeUnixNano: at(time.Millisecond)},
					{Name: "first_byte", TimeUnixNano: at(3 * time.Millisecond)}, {Name: "first_token", TimeUnixNano: at(5 * time.Millisecond)}},
				Status: &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "upstream_error"},
				Flags:  0x301,
			}, {
				TraceId: bare.Trace[:], SpanId: bare.Span[:], Name: "GET", Kind: tracepb.Span_SPAN_KIND_SERVER,
				StartTimeUnixNano: at(0), EndTimeUnixNano: at(0),
				Attributes: []*commonpb.KeyValue{str("http.request.method", "GET"), num("http.response.status_code", 401),
					str("fastroute.outcome", "invalid"), num("fastroute.attempts", 0), flag("fastroute.stream", false)},
				Flags: 0x101,
			}},
		}},
	}}}
	assert.True(t, proto.Equal(want, got), "got %v", got)
}

// The export's headers are read from OpenTelemetry's environment
// variables as its exporters read them, the traces' own first; a bad one
// is refused without quoting it.
func TestHeadersFromEnv(t *testing.T) {
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	h, err := HeadersFromEnv(env(nil))
	require.NoError(t, err)
	assert.Nil(t, h)
	h, err = HeadersFromEnv(env(map[string]string{
		"OTEL_EXPORTER_OTLP_HEADERS":        "x-generic=1",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS": " Authorization = Basic%20dXNlcjpwYXNz , x-tenant=a%2Cb",
	}))
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"Authorization": "Basic dXNlcjpwYXNz", "x-tenant": "a,b"}, h)
	for _, bad := range []string{"no-equals-secret", "bad name=secret", "a=secret%0A", "a=%zz-secret"} {
		_, err := HeadersFromEnv(env(map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "ok=1," + bad}))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "OTEL_EXPORTER_OTLP_HEADERS: header 2 ")
		assert.NotContains(t, err.Error(), "secret")
	}
	key, err := Config{SampleRatio: 1, OTLPEndpoint: "http://c", ServiceName: "s", Headers: map[string]string{"bad name": "v"}}.Check()
	assert.Equal(t, "headers", key)
	assert.Error(t, err)
}
