package tracing

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/puzpuzpuz/xsync/v3"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Options tune the export; the zero value takes the defaults.
type Options struct {
	QueueSize int           // spans held for export at most (8192): more are dropped
	BatchSize int           // spans sent in one request at most (1024)
	Interval  time.Duration // how often the queue is sent (200 ms)
	Timeout   time.Duration // bounds one export request (10 s)
	Logger    *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.QueueSize <= 0 {
		o.QueueSize = 8192
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 1024
	}
	if o.Interval <= 0 {
		o.Interval = 200 * time.Millisecond
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// failureLogEvery spaces the warnings of failed exports.
const failureLogEvery = time.Minute

// exporter queues finished spans and posts them, in batches, to the
// collector as OTLP/HTTP protobuf. Nothing is retried: a batch the
// collector does not take is counted failed and dropped, so a collector
// that is down costs the router no memory beyond the queue.
type exporter struct {
	url      string
	opts     Options
	queue    *xsync.MPMCQueueOf[Span]
	client   *http.Client
	resource *resourcepb.Resource

	exported, dropped, failed metrics.Counter

	stop    chan struct{}
	done    chan struct{} // closed once the export goroutine (Start) ended
	started bool
	once    sync.Once
	lastLog time.Time // the last failure warned of (the export goroutine's)
}

func newExporter(url, service string, opts Options) *exporter {
	opts = opts.withDefaults()
	return &exporter{
		url: url, opts: opts, queue: xsync.NewMPMCQueueOf[Span](opts.QueueSize),
		client: &http.Client{Timeout: opts.Timeout},
		resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{
			stringAttr("service.name", service),
			stringAttr("telemetry.sdk.name", "fastroute"),
		}},
		exported: metrics.NewCounter(), dropped: metrics.NewCounter(), failed: metrics.NewCounter(),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// enqueueTries bounds the tries to queue a span: a try fails on a full
// queue, and on a race with another request's span for the same slot.
const enqueueTries = 4

func (e *exporter) enqueue(s *Span) {
	for range enqueueTries {
		if e.queue.TryEnqueue(*s) {
			return
		}
	}
	e.dropped.Inc()
}

// Start sends the queued spans every Options.Interval until Close.
func (e *exporter) Start() {
	e.started = true
	go func() {
		defer close(e.done)
		tick := time.NewTicker(e.opts.Interval)
		defer tick.Stop()
		for {
			select {
			case <-e.stop:
				return
			case <-tick.C:
				e.drain(context.Background())
			}
		}
	}()
}

// Close stops the export goroutine, if Start started it, and sends what
// is queued, within ctx.
func (e *exporter) Close(ctx context.Context) {
	e.once.Do(func() { close(e.stop) })
	if e.started {
		select {
		case <-e.done:
		case <-ctx.Done():
			return
		}
	}
	e.drain(ctx)
}

// drain sends the queued spans in batches until the queue is empty.
func (e *exporter) drain(ctx context.Context) {
	batch := make([]Span, 0, e.opts.BatchSize)
	for ctx.Err() == nil {
		batch = batch[:0]
		for len(batch) < e.opts.BatchSize {
			s, ok := e.queue.TryDequeue()
			if !ok {
				break
			}
			batch = append(batch, s)
		}
		if len(batch) == 0 {
			return
		}
		e.send(ctx, batch)
	}
}

// send posts one batch and counts how it went.
func (e *exporter) send(ctx context.Context, batch []Span) {
	n := uint64(len(batch))
	body, err := proto.Marshal(e.request(batch))
	if err == nil {
		err = e.post(ctx, body)
	}
	if err != nil {
		e.failed.Add(n)
		if time.Since(e.lastLog) >= failureLogEvery {
			e.lastLog = time.Now()
			e.opts.Logger.Warn("spans not exported", "endpoint", e.url, "spans", n, "err", err)
		}
		return
	}
	e.exported.Add(n)
}

func (e *exporter) post(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return &statusError{resp.StatusCode}
	}
	return nil
}

// statusError is a collector's refusal.
type statusError struct{ status int }

func (e *statusError) Error() string {
	return "the collector answered " + http.StatusText(e.status)
}

// request is the OTLP export request of a batch.
func (e *exporter) request(batch []Span) *coltracepb.ExportTraceServiceRequest {
	spans := make([]*tracepb.Span, len(batch))
	for i := range batch {
		spans[i] = batch[i].proto()
	}
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource: e.resource,
		ScopeSpans: []*tracepb.ScopeSpans{{
			Scope: &commonpb.InstrumentationScope{Name: "github.com/fastroute/fastroute"}, Spans: spans,
		}},
	}}}
}

// proto is s as OTLP has it: HTTP server attributes and gen_ai's request
// model and usage by OpenTelemetry's semantic conventions, the router's own
// under fastroute.*, and the request's steps as events.
func (s *Span) proto() *tracepb.Span {
	start := s.Start.UnixNano()
	p := &tracepb.Span{
		TraceId: s.Trace[:], SpanId: s.Span[:], Name: s.Name, Kind: tracepb.Span_SPAN_KIND_SERVER,
		StartTimeUnixNano: uint64(start), EndTimeUnixNano: uint64(start + int64(s.Duration)),
		// Sampled, and whether the parent is remote is known: it is when
		// there is one (the client's).
		Flags: 1 | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK),
		Attributes: []*commonpb.KeyValue{
			stringAttr("http.request.method", s.Method),
			intAttr("http.response.status_code", int64(s.Status)),
			stringAttr("fastroute.outcome", s.Outcome),
			intAttr("fastroute.attempts", int64(s.Attempts)),
			boolAttr("fastroute.stream", s.Stream),
		},
	}
	if s.Parent != (SpanID{}) {
		p.ParentSpanId = s.Parent[:]
		p.Flags |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
	}
	if s.Route != "" {
		p.Attributes = append(p.Attributes, stringAttr("http.route", s.Route))
	}
	if s.modelLen > 0 {
		p.Attributes = append(p.Attributes, stringAttr("gen_ai.request.model", s.Model()))
	}
	if s.Worker != 0 {
		p.Attributes = append(p.Attributes, intAttr("fastroute.worker.id", int64(s.Worker)))
	}
	if s.InputTokens > 0 || s.OutputTokens > 0 {
		p.Attributes = append(p.Attributes, intAttr("gen_ai.usage.input_tokens", int64(s.InputTokens)),
			intAttr("gen_ai.usage.output_tokens", int64(s.OutputTokens)))
	}
	event := func(name string, at time.Duration) {
		p.Events = append(p.Events, &tracepb.Span_Event{Name: name, TimeUnixNano: uint64(start + int64(at))})
	}
	if s.Sent > 0 {
		event("sent_to_worker", s.Sent)
		if s.FirstByte > 0 {
			event("first_byte", s.Sent+s.FirstByte)
		}
	}
	if s.FirstToken > 0 {
		event("first_token", s.FirstToken)
	}
	if s.Error {
		p.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: s.Outcome}
	}
	return p
}

func stringAttr(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func intAttr(k string, v int64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
}

func boolAttr(k string, v bool) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v}}}
}

// Collector exports the spans' counts and the sample ratio.
func (t *Tracer) Collector() metrics.Collector {
	return func(w *metrics.Writer) {
		w.Header("fastroute_trace_spans_total", "counter",
			"Spans of traced requests by what became of them: exported to the collector, dropped for a full queue, failed (the collector did not take them).")
		w.Sample("fastroute_trace_spans_total", float64(t.exported.Value()), "outcome", "exported")
		w.Sample("fastroute_trace_spans_total", float64(t.dropped.Value()), "outcome", "dropped")
		w.Sample("fastroute_trace_spans_total", float64(t.failed.Value()), "outcome", "failed")
		w.Single("fastroute_trace_sample_ratio", "gauge",
			"Share of the requests without a sampled traceparent that start a trace.", t.SampleRatio())
	}
}

// Counts returns the spans exported, dropped and failed so far.
func (t *Tracer) Counts() (exported, dropped, failed uint64) {
	return t.exported.Value(), t.dropped.Value(), t.failed.Value()
}
