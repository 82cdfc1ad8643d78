// Package otlpsink is an OpenTelemetry collector's OTLP/HTTP traces
// receiver in miniature, on loopback: it keeps the spans posted to it
// (protobuf, as the router's tracing exports them) for the tests and the
// demo to read.
package otlpsink

import (
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Path is where the sink takes exports, OTLP/HTTP's traces path.
const Path = "/v1/traces"

// Span is one span received, with the service.name of its resource.
type Span struct {
	*tracepb.Span
	Service string
}

// Attr returns the value of the span's attribute key (a string, int64 or
// bool), nil when it has none.
func (s Span) Attr(key string) any { return Attr(s.Attributes, key) }

// Attr returns the value of key among attributes (a span's, an event's):
// a string, int64 or bool, nil when it is not there.
func Attr(attributes []*commonpb.KeyValue, key string) any {
	for _, kv := range attributes {
		if kv.Key == key {
			switch v := kv.Value.Value.(type) {
			case *commonpb.AnyValue_StringValue:
				return v.StringValue
			case *commonpb.AnyValue_IntValue:
				return v.IntValue
			case *commonpb.AnyValue_BoolValue:
				return v.BoolValue
			}
		}
	}
	return nil
}

// Sink is a running receiver.
type Sink struct {
	ln     net.Listener
	srv    *http.Server
	mu     sync.Mutex
	spans  []Span
	posts  int
	header http.Header // the last export's
	status int         // the answer to an export: 200, or what SetStatus set
}

// Start starts a sink on a free loopback port.
func Start() (*Sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Sink{ln: ln, status: http.StatusOK}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.receive)}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL is the sink's traces endpoint.
func (s *Sink) URL() string { return "http://" + s.ln.Addr().String() + Path }

// SetStatus has the sink answer exports with status (a collector that
// refuses them), keeping none while it is not 200.
func (s *Sink) SetStatus(status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = status
}

// Spans returns the spans received so far, in the order they came.
func (s *Sink) Spans() []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Span(nil), s.spans...)
}

// SpanOf returns the first span received of the trace of id trace (in
// hex), false while none came.
func (s *Sink) SpanOf(trace string) (Span, bool) {
	for _, sp := range s.Spans() {
		if hex.EncodeToString(sp.TraceId) == trace {
			return sp, true
		}
	}
	return Span{}, false
}

// Posts returns the export requests received so far.
func (s *Sink) Posts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.posts
}

// Header returns the header name of the last export received.
func (s *Sink) Header(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header.Get(name)
}

// Close stops the sink.
func (s *Sink) Close() error { return s.srv.Close() }

func (s *Sink) receive(w http.ResponseWriter, r *http.Request) {
	req, err := decode(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.posts, s.header = s.posts+1, r.Header.Clone()
	if s.status != http.StatusOK {
		w.WriteHeader(s.status)
		return
	}
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				s.spans = append(s.spans, Span{Span: sp, Service: service})
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// decode reads an OTLP/HTTP protobuf export request.
func decode(r *http.Request) (*coltracepb.ExportTraceServiceRequest, error) {
	if r.Method != http.MethodPost || r.URL.Path != Path {
		return nil, errors.New("not a POST to " + Path)
	}
	if r.Header.Get("Content-Type") != "application/x-protobuf" {
		return nil, errors.New("not application/x-protobuf")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		return nil, err
	}
	req := &coltracepb.ExportTraceServiceRequest{}
	return req, proto.Unmarshal(body, req)
}
