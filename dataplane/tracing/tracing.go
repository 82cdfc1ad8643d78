// Package tracing records the router's span of each sampled request and
// exports the spans to an OpenTelemetry collector over OTLP/HTTP, so that
// a request's time in the router (its wait, its pick, its retries, its
// worker's first byte and first token) shows in the same trace as the
// client's spans and the engine's (vLLM's and SGLang's --otlp-traces-endpoint
// spans are children of the span a request's traceparent names, which is
// the router's once it traces the request). A Tracer decides per request
// and records without locks or allocation: a span is filled in place and
// queued by value; a goroutine of its own batches and sends them.
package tracing

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Config is the tracing key of the router's config.
type Config struct {
	// OTLPEndpoint is the collector's OTLP/HTTP traces URL (protobuf), as
	// http://collector:4318/v1/traces; one with no path gets /v1/traces.
	// Empty: nothing is traced and traceparent headers pass untouched.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// SampleRatio is the share of the requests that come without a
	// traceparent which start a trace here (OpenTelemetry's
	// parentbased_traceidratio: a request whose traceparent is valid is
	// traced when its sampled flag is set, whatever the ratio).
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name of the spans' resource.
	ServiceName string `yaml:"service_name"`
	// Headers go on every export request: a hosted collector's
	// credentials, say, so their values count as secrets. None set: those
	// of the environment's OTEL_EXPORTER_OTLP_TRACES_HEADERS, else
	// OTEL_EXPORTER_OTLP_HEADERS (HeadersFromEnv).
	Headers map[string]string `yaml:"headers,omitempty"`
}

// The environment variables of OpenTelemetry's exporters that hold the
// export's headers, the first set taken.
var headersEnv = []string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"}

// HeadersFromEnv returns the export headers the environment (getenv) sets,
// as OpenTelemetry's exporters read them: "name=value,name=value", each
// part percent-encoded, in the first of headersEnv that is set; nil when
// none is. Its errors name the variable and never quote a value.
func HeadersFromEnv(getenv func(string) string) (map[string]string, error) {
	for _, env := range headersEnv {
		v := getenv(env)
		if v == "" {
			continue
		}
		h := map[string]string{}
		for i, pair := range strings.Split(v, ",") {
			name, value, ok := strings.Cut(pair, "=")
			name, nerr := url.PathUnescape(strings.TrimSpace(name))
			value, verr := url.PathUnescape(strings.TrimSpace(value))
			switch {
			case !ok || nerr != nil || verr != nil:
				return nil, fmt.Errorf("environment variable %s: header %d is not a percent-encoded name=value", env, i+1)
			case !httpguts.ValidHeaderFieldName(name) || !httpguts.ValidHeaderFieldValue(value):
				return nil, fmt.Errorf("environment variable %s: header %d is not a valid HTTP header", env, i+1)
			}
			h[name] = value
		}
		return h, nil
	}
	return nil, nil
}

// On says the config turns tracing on.
func (c Config) On() bool { return c.OTLPEndpoint != "" }

// Check validates c; its errors name the key below tracing.
func (c Config) Check() (key string, err error) {
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) {
		return "sample_ratio", fmt.Errorf("%g is not a ratio between 0 and 1", c.SampleRatio)
	}
	if !c.On() {
		return "", nil
	}
	if _, err := exportURL(c.OTLPEndpoint); err != nil {
		return "otlp_endpoint", err
	}
	if c.ServiceName == "" {
		return "service_name", fmt.Errorf("is empty; the spans need a service.name")
	}
	for name, value := range c.Headers {
		if !httpguts.ValidHeaderFieldName(name) {
			return "headers", fmt.Errorf("%q is not an HTTP header name", name)
		}
		if !httpguts.ValidHeaderFieldValue(value) {
			return "headers." + name, errors.New("is not a valid HTTP header value") // not quoted: a secret
		}
	}
	return "", nil
}

// exportURL is the URL spans are posted to: endpoint, with /v1/traces
// when it names no path.
func exportURL(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return "", errors.New("is not a URL") // not quoted: it may hold a password
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return "", fmt.Errorf("%q is not an http:// or https:// URL with a host (an OTLP/HTTP traces endpoint, as http://collector:4318/v1/traces)", u.Redacted())
	case u.Path == "" || u.Path == "/":
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// maxModel bounds the model name a span keeps (longer ones are cut).
const maxModel = 128

// Span is the router's span of one request: a server span from the
// moment its request was read to the end of its answer (a stream's last
// event). The front end fills it in place.
type Span struct {
	Context         // its trace and its own id
	Parent   SpanID // the client's span; zero: the trace starts here
	Name     string // "METHOD /route", or the method alone for a path of no named route
	Method   string
	Route    string // "" for a path of no named route
	Start    time.Time
	Duration time.Duration
	Status   int    // the HTTP status of the answer to the client
	Outcome  string // how the request ended (fastroute_requests_total's outcome); a 5xx Status is an error
	Worker   uint64 // the worker that answered, the last one tried; 0: none was picked
	Attempts int    // workers tried
	Stream   bool   // the request asked for a stream
	// Client is the client's address and port (a PROXY protocol header's,
	// or a trusted balancer's forwarding header's, behind a balancer);
	// port 0: unknown, as a forwarding header may name none; invalid:
	// unknown.
	Client    netip.AddrPort
	Picked    time.Duration // since Start: when its worker was reserved, after any wait in the queue; 0: never
	Sent      time.Duration // since Start: when the request left for its worker (its last try); 0: never
	FirstByte time.Duration // since Sent: the worker's first byte; 0: none
	// FirstToken is since Start: when the first token's event left for
	// the client, for streams of generated tokens; 0: none.
	FirstToken                time.Duration
	InputTokens, OutputTokens uint64 // as the answer's usage said; both 0: not read
	// A split request's prefill leg: its worker (0: none) and when its
	// answer ended, since Start (0: it did not).
	PrefillWorker uint64
	Prefilled     time.Duration

	model    [maxModel]byte
	modelLen uint8
	moves    [maxMoves]Move
	nMoves   uint8
}

// maxMoves bounds the moves a span keeps (the router makes at most 8
// tries).
const maxMoves = 8

// Move is a try that moved the request on to another worker: a retry.
type Move struct {
	At     time.Duration // since Start: when the try ended
	Worker uint64        // the worker tried
	// Reason is why: connect, transport or timeout (the try failed: the
	// worker failures' reasons), or status (its answer's status, Status,
	// is one to retry, or a 404 to a search for a stored response).
	Reason string
	Status int
}

// AddMove records a try that moved the request on (the first maxMoves).
func (s *Span) AddMove(m Move) {
	if int(s.nMoves) < len(s.moves) {
		s.moves[s.nMoves] = m
		s.nMoves++
	}
}

// SetModel keeps the request's model name (its first maxModel bytes).
func (s *Span) SetModel(m []byte) { s.modelLen = uint8(copy(s.model[:], m)) }

// Tracer samples requests and exports their spans. It is off (Configure
// with a config that is not On) or on, and exports to one collector at a
// time; the counts of its spans run on over its configurations.
type Tracer struct {
	bound atomic.Uint64            // the sample ratio as a bound on a trace id's low 63 bits (sampled)
	exp   atomic.Pointer[exporter] // the export of the spans; nil: tracing is off
	*counts
	opts    Options
	started atomic.Bool    // Start was called: a new export starts at once
	retired sync.WaitGroup // the closes of the exports Configure replaced
	cfg     Config         // the one Configure applied (its caller's)
}

// New returns a Tracer configured with cfg (Configure), or Check's refusal
// of cfg; Start starts its export. opts may be zero.
func New(cfg Config, opts Options) (*Tracer, error) {
	t := &Tracer{counts: newCounts(), opts: opts.withDefaults()}
	if err := t.Configure(cfg); err != nil {
		return nil, err
	}
	return t, nil
}

// Configure applies cfg (a reload's): its sample ratio, and its collector.
// A config that is not On turns tracing off; a new collector (endpoint,
// service name or headers) gets the spans ended from then on, in an export
// of its own. The export it replaces sends the spans it holds in the
// background, within Options.Timeout (Close waits for it); a span ended
// as the two change places may be lost. A refused cfg (Check) changes
// nothing. Calls must not overlap.
func (t *Tracer) Configure(cfg Config) error {
	if key, err := cfg.Check(); err != nil {
		return fmt.Errorf("tracing.%s: %w", key, err)
	}
	t.SetSampleRatio(cfg.SampleRatio)
	if SameCollector(cfg, t.cfg) && (t.exp.Load() != nil) == cfg.On() {
		t.cfg = cfg
		return nil
	}
	t.cfg = cfg
	var next *exporter
	if cfg.On() {
		target, _ := exportURL(cfg.OTLPEndpoint)
		next = newExporter(target, cfg.ServiceName, cfg.Headers, t.opts, t.counts)
		if t.started.Load() {
			next.Start()
		}
	}
	if prev := t.exp.Swap(next); prev != nil {
		t.retired.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), t.opts.Timeout)
			defer cancel()
			prev.Close(ctx)
		})
	}
	return nil
}

// SameCollector says a and b export to the same collector the same way:
// their endpoints, service names and headers are equal.
func SameCollector(a, b Config) bool {
	return a.OTLPEndpoint == b.OTLPEndpoint && a.ServiceName == b.ServiceName && maps.Equal(a.Headers, b.Headers)
}

// On says the Tracer traces: its config is On.
func (t *Tracer) On() bool { return t.exp.Load() != nil }

// Start starts the export, and those Configure makes from then on: each
// sends its queued spans every Options.Interval until it is replaced or
// Close.
func (t *Tracer) Start() {
	t.started.Store(true)
	if e := t.exp.Load(); e != nil {
		e.Start()
	}
}

// Close turns tracing off and sends the spans still queued, the replaced
// exports' too, within ctx; then it closes the connections kept to the
// collectors.
func (t *Tracer) Close(ctx context.Context) {
	if e := t.exp.Swap(nil); e != nil {
		e.Close(ctx)
	}
	closed := make(chan struct{})
	go func() {
		t.retired.Wait()
		close(closed)
	}()
	select {
	case <-closed:
	case <-ctx.Done():
	}
}

// SetSampleRatio sets the share of requests without a traceparent that
// are traced (a reload's).
func (t *Tracer) SetSampleRatio(r float64) {
	// OpenTelemetry's TraceIDRatioBased: a trace id is in when its low 8
	// bytes, less their lowest bit, fall under ratio·2⁶³.
	t.bound.Store(uint64(min(max(r, 0), 1) * (1 << 63)))
}

// SampleRatio returns the share SetSampleRatio set.
func (t *Tracer) SampleRatio() float64 { return float64(t.bound.Load()) / (1 << 63) }

// sampled says a new trace of id t is traced at the bound b.
func sampled(t TraceID, b uint64) bool { return binary.BigEndian.Uint64(t[8:])>>1 < b }

// Begin decides whether the request whose traceparent header is
// traceparent (nil: none) is traced (its caller asks while On), and if so
// readies s for it: its own span id, in the client's trace when the header
// is valid and sampled, in a new one otherwise. A valid traceparent that
// is not sampled leaves the request untraced, whatever the ratio
// (parent-based sampling); an invalid one counts as none.
func (t *Tracer) Begin(s *Span, traceparent []byte, start time.Time) bool {
	var c Context
	var parent SpanID
	if p, ok := Parse(traceparent); ok {
		if !p.Sampled {
			return false
		}
		c.Trace, parent = p.Trace, p.Span
	} else {
		b := t.bound.Load()
		if b == 0 {
			return false
		}
		if c.Trace = newTraceID(); !sampled(c.Trace, b) {
			return false
		}
	}
	c.Span, c.Sampled = newSpanID(), true
	*s = Span{Context: c, Parent: parent, Start: start}
	return true
}

// End queues the finished span s for export: a copy, so s may be reused
// at once. A full queue drops it (counted), as does a Tracer turned off
// since the span began.
func (t *Tracer) End(s *Span) {
	if e := t.exp.Load(); e != nil {
		e.enqueue(s)
		return
	}
	t.dropped.Inc()
}
