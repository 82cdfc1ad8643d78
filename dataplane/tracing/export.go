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
	url    string
	opts   Options
	queue  *xsync.MPMCQueueOf[Span]
	client *http.Client
	header http.Header // of every export request: Config.Headers and the content type
	// The export goroutine's (Start), Close's once it ended: the batch
	// taken from the queue, and its encoder.
	batch []Span
	enc   *encoder

	*counts // its Tracer's

	stop    chan struct{}
	done    chan struct{} // closed once the export goroutine (Start) ended
	started bool
	once    sync.Once
	lastLog time.Time // the last failure warned of (the export goroutine's)
}

// counts are a Tracer's spans by what became of them, over its exporters.
type counts struct{ exported, dropped, failed metrics.Counter }

func newCounts() *counts {
	return &counts{exported: metrics.NewCounter(), dropped: metrics.NewCounter(), failed: metrics.NewCounter()}
}

func newExporter(url, service string, headers map[string]string, opts Options, c *counts) *exporter {
	h := http.Header{"Content-Type": {"application/x-protobuf"}}
	for name, value := range headers {
		h.Set(name, value)
	}
	return &exporter{
		url: url, opts: opts, queue: xsync.NewMPMCQueueOf[Span](opts.QueueSize),
		// A transport of its own, whose kept connection Close closes.
		client: &http.Client{Timeout: opts.Timeout, Transport: http.DefaultTransport.(*http.Transport).Clone()}, header: h,
		batch: make([]Span, 0, opts.BatchSize), enc: newEncoder(service), counts: c,
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
// is queued, within ctx; then it closes the connection kept to the
// collector.
func (e *exporter) Close(ctx context.Context) {
	defer e.client.CloseIdleConnections()
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
	for ctx.Err() == nil {
		batch := e.batch[:0]
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
	if err := e.post(ctx, e.enc.request(batch)); err != nil {
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
	req.Header = e.header
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

// Collector exports the spans' counts and the sample ratio while tracing
// is on.
func (t *Tracer) Collector() metrics.Collector {
	return func(w *metrics.Writer) {
		if !t.On() {
			return
		}
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
