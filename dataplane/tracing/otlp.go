package tracing

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The field numbers of OTLP's messages that the export writes
// (opentelemetry-proto: collector/trace/v1/trace_service.proto,
// trace/v1/trace.proto, resource/v1/resource.proto, common/v1/common.proto).
const (
	requestResourceSpans = 1 // ExportTraceServiceRequest.resource_spans

	resourceSpansResource   = 1 // ResourceSpans.resource
	resourceSpansScopeSpans = 2 // ResourceSpans.scope_spans
	resourceAttributes      = 1 // Resource.attributes
	scopeSpansScope         = 1 // ScopeSpans.scope
	scopeSpansSpans         = 2 // ScopeSpans.spans
	scopeName               = 1 // InstrumentationScope.name

	spanTraceID      = 1
	spanSpanID       = 2
	spanParentSpanID = 4
	spanName         = 5
	spanKind         = 6
	spanStart        = 7
	spanEnd          = 8
	spanAttributes   = 9
	spanEvents       = 11
	spanStatus       = 15
	spanFlags        = 16

	eventTime       = 1 // Span.Event.time_unix_nano
	eventName       = 2 // Span.Event.name
	eventAttributes = 3 // Span.Event.attributes
	statusMessage   = 2 // Status.message
	statusCode      = 3 // Status.code

	keyValueKey   = 1 // KeyValue.key
	keyValueValue = 2 // KeyValue.value
	anyString     = 1 // AnyValue.string_value
	anyBool       = 2 // AnyValue.bool_value
	anyInt        = 3 // AnyValue.int_value
)

// Values of OTLP's enums and span flags.
const (
	kindServer      = 2     // Span.SpanKind SPAN_KIND_SERVER
	statusCodeError = 2     // Status.StatusCode STATUS_CODE_ERROR
	flagSampled     = 0x01  // the W3C trace flags' sampled bit
	flagHasIsRemote = 0x100 // SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK: whether the parent is remote is known
	flagIsRemote    = 0x200 // SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK: the parent is remote
)

// instrumentationScope is the name of the scope the spans are under.
const instrumentationScope = "github.com/fastroute/fastroute"

// encoder writes export requests in OTLP's protobuf encoding with
// protowire, into buffers it keeps from one batch to the next: a batch
// costs no message objects (OpenTelemetry's generated types allocate a
// few dozen a span) and a span's encoding is a few hundred bytes appended.
type encoder struct {
	resource []byte // ResourceSpans.resource, the same in every request
	scope    []byte // ScopeSpans.scope, the same too
	span     []byte // one span's encoding
	spans    []byte // the batch's spans, each a ScopeSpans.spans field
	out      []byte // the request
}

func newEncoder(service string) *encoder {
	var resource, scope []byte
	resource = appendStringAttr(resource, resourceAttributes, "service.name", service)
	resource = appendStringAttr(resource, resourceAttributes, "telemetry.sdk.name", "fastroute")
	scope = appendString(scope, scopeName, instrumentationScope)
	return &encoder{
		resource: appendBytes(nil, resourceSpansResource, resource),
		scope:    appendBytes(nil, scopeSpansScope, scope),
	}
}

// request encodes an ExportTraceServiceRequest of batch: one ResourceSpans
// (the resource, then one ScopeSpans of the scope and the spans). The
// result is the encoder's until its next request.
func (e *encoder) request(batch []Span) []byte {
	e.spans = e.spans[:0]
	for i := range batch {
		e.span = batch[i].appendProto(e.span[:0])
		e.spans = appendBytes(e.spans, scopeSpansSpans, e.span)
	}
	scopeSpansLen := len(e.scope) + len(e.spans)
	resourceSpansLen := len(e.resource) + protowire.SizeTag(resourceSpansScopeSpans) + protowire.SizeBytes(scopeSpansLen)
	out := protowire.AppendTag(e.out[:0], requestResourceSpans, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(resourceSpansLen))
	out = append(out, e.resource...)
	out = protowire.AppendTag(out, resourceSpansScopeSpans, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(scopeSpansLen))
	out = append(out, e.scope...)
	e.out = append(out, e.spans...)
	return e.out
}

// appendProto appends s as an OTLP Span: a server span with OpenTelemetry's
// HTTP attributes and gen_ai's request model and usage by its semantic
// conventions, the router's own under fastroute.*, the request's steps as
// events, and an error status for a 5xx.
func (s *Span) appendProto(b []byte) []byte {
	start := s.Start.UnixNano()
	flags := uint32(flagSampled | flagHasIsRemote)
	b = appendBytes(b, spanTraceID, s.Trace[:])
	b = appendBytes(b, spanSpanID, s.Span[:])
	if s.Parent != (SpanID{}) {
		b = appendBytes(b, spanParentSpanID, s.Parent[:])
		flags |= flagIsRemote // the client's
	}
	b = appendString(b, spanName, s.Name)
	b = protowire.AppendTag(b, spanKind, protowire.VarintType)
	b = protowire.AppendVarint(b, kindServer)
	b = protowire.AppendTag(b, spanStart, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, uint64(start))
	b = protowire.AppendTag(b, spanEnd, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, uint64(start+int64(s.Duration)))

	b = appendStringAttr(b, spanAttributes, "http.request.method", s.Method)
	b = appendIntAttr(b, "http.response.status_code", int64(s.Status))
	if s.Route != "" {
		b = appendStringAttr(b, spanAttributes, "http.route", s.Route)
	}
	if s.modelLen > 0 {
		b = appendStringAttr(b, spanAttributes, "gen_ai.request.model", s.model[:s.modelLen])
	}
	if s.InputTokens > 0 || s.OutputTokens > 0 {
		b = appendIntAttr(b, "gen_ai.usage.input_tokens", int64(s.InputTokens))
		b = appendIntAttr(b, "gen_ai.usage.output_tokens", int64(s.OutputTokens))
	}
	if s.Client.IsValid() {
		var room [len("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255%zone")]byte
		b = appendStringAttr(b, spanAttributes, "client.address", s.Client.Addr().AppendTo(room[:0]))
		if s.Client.Port() != 0 {
			b = appendIntAttr(b, "client.port", int64(s.Client.Port()))
		}
	}
	b = appendStringAttr(b, spanAttributes, "fastroute.outcome", s.Outcome)
	if s.Worker != 0 {
		b = appendIntAttr(b, "fastroute.worker.id", int64(s.Worker))
	}
	if s.PrefillWorker != 0 {
		b = appendIntAttr(b, "fastroute.prefill.worker.id", int64(s.PrefillWorker))
	}
	b = appendIntAttr(b, "fastroute.attempts", int64(s.Attempts))
	stream := uint64(0)
	if s.Stream {
		stream = 1
	}
	b = appendVarintAttr(b, spanAttributes, "fastroute.stream", anyBool, stream)

	if s.Picked > 0 {
		b = appendEvent(b, "worker_picked", start, s.Picked, nil)
	}
	for _, m := range s.moves[:s.nMoves] {
		b = appendMove(b, start, &m)
	}
	if s.Prefilled > 0 {
		b = appendEvent(b, "prefill_done", start, s.Prefilled, nil)
	}
	if s.Sent > 0 {
		b = appendEvent(b, "sent_to_worker", start, s.Sent, nil)
		if s.FirstByte > 0 {
			b = appendEvent(b, "first_byte", start, s.Sent+s.FirstByte, nil)
		}
	}
	if s.FirstToken > 0 {
		b = appendEvent(b, "first_token", start, s.FirstToken, nil)
	}
	if s.Status >= 500 { // the router's failure or its worker's
		n := protowire.SizeTag(statusMessage) + protowire.SizeBytes(len(s.Outcome)) +
			protowire.SizeTag(statusCode) + protowire.SizeVarint(statusCodeError)
		b = protowire.AppendTag(b, spanStatus, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		b = appendString(b, statusMessage, s.Outcome)
		b = protowire.AppendTag(b, statusCode, protowire.VarintType)
		b = protowire.AppendVarint(b, statusCodeError)
	}
	b = protowire.AppendTag(b, spanFlags, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, flags)
}

// appendEvent appends a Span.Event named name, at since after start, with
// attrs (encoded attributes fields; nil: none).
func appendEvent(b []byte, name string, start int64, since time.Duration, attrs []byte) []byte {
	n := protowire.SizeTag(eventTime) + protowire.SizeFixed64() + protowire.SizeTag(eventName) + protowire.SizeBytes(len(name)) + len(attrs)
	b = protowire.AppendTag(b, spanEvents, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = protowire.AppendTag(b, eventTime, protowire.Fixed64Type)
	b = protowire.AppendFixed64(b, uint64(start+int64(since)))
	b = appendString(b, eventName, name)
	return append(b, attrs...)
}

// appendMove appends the event "moved_on" of a try that moved the request
// on, with the worker tried, the reason and the answer's status.
func appendMove(b []byte, start int64, m *Move) []byte {
	var attrs [256]byte
	a := appendVarintAttr(attrs[:0], eventAttributes, "fastroute.worker.id", anyInt, m.Worker)
	a = appendStringAttr(a, eventAttributes, "fastroute.move.reason", m.Reason)
	if m.Status > 0 {
		a = appendVarintAttr(a, eventAttributes, "http.response.status_code", anyInt, uint64(m.Status))
	}
	return appendEvent(b, "moved_on", start, m.At, a)
}

// appendStringAttr appends a KeyValue field of a string value.
func appendStringAttr[T string | []byte](b []byte, field protowire.Number, key string, v T) []byte {
	value := protowire.SizeTag(anyString) + protowire.SizeBytes(len(v))
	b = appendKeyValueHead(b, field, key, value)
	b = protowire.AppendTag(b, anyString, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(v)))
	return append(b, v...)
}

// appendIntAttr appends a span attribute of an int value.
func appendIntAttr(b []byte, key string, v int64) []byte {
	return appendVarintAttr(b, spanAttributes, key, anyInt, uint64(v))
}

// appendVarintAttr appends a KeyValue field whose value is the varint
// member of AnyValue (int_value, bool_value).
func appendVarintAttr(b []byte, field protowire.Number, key string, member protowire.Number, v uint64) []byte {
	b = appendKeyValueHead(b, field, key, protowire.SizeTag(member)+protowire.SizeVarint(v))
	b = protowire.AppendTag(b, member, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// appendKeyValueHead appends a KeyValue field up to its AnyValue's
// content, value bytes long, which the caller appends.
func appendKeyValueHead(b []byte, field protowire.Number, key string, value int) []byte {
	n := protowire.SizeTag(keyValueKey) + protowire.SizeBytes(len(key)) + protowire.SizeTag(keyValueValue) + protowire.SizeBytes(value)
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = appendString(b, keyValueKey, key)
	b = protowire.AppendTag(b, keyValueValue, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(value))
}

func appendString(b []byte, field protowire.Number, v string) []byte {
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendString(b, v)
}

// appendBytes appends a bytes field, or an embedded message of encoding v.
func appendBytes(b []byte, field protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, field, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}
