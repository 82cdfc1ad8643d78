package frontend

import (
	"net/http"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/valyala/fasthttp"
)

// spanNames are the spans' names of POSTs to each route, as
// OpenTelemetry's HTTP conventions name server spans ("METHOD route"; the
// method alone where no route is named).
var spanNames = func() (names [numRoutes]string) {
	for rt := range numRoutes {
		names[rt] = http.MethodPost
		if rt != routeOther {
			names[rt] += " " + routeNames[rt]
		}
	}
	return names
}()

// spanRecord is a traced request's span and the traceparent it went on
// with. An exchange makes its own at its first request while tracing is
// on and keeps it: with tracing off no exchange, and so no open stream,
// holds the 300 bytes of a span.
type spanRecord struct {
	tracing.Span
	traceparent []byte
}

// traceRequest decides whether the request is traced (Options.Tracer,
// while it is on) and, if so, starts its span and sends it on with the
// span's traceparent in place of the client's: its worker's span (an
// engine's, a mirror's copy's, both legs' of a split request) is then the
// router's child.
func (ex *exchange) traceRequest(ctx *fasthttp.RequestCtx, start time.Time) {
	t := ex.s.opts.Tracer
	if ex.traced = false; t == nil || !t.On() {
		return
	}
	if ex.trace == nil {
		ex.trace = &spanRecord{}
	}
	rec := ex.trace
	if ex.traced = t.Begin(&rec.Span, ctx.Request.Header.Peek(tracing.Header), start); !ex.traced {
		return
	}
	sp := &rec.Span
	if ex.pol.Access != AccessOff {
		sp.Client = ex.clientAt // begin found it for the access log
	} else {
		sp.Client, _ = ex.pol.clientOf(ctx)
	}
	sp.Method = methodName(ctx.Method())
	sp.Name = sp.Method
	if ctx.IsPost() {
		sp.Name = spanNames[ex.rt]
		if ex.rt != routeOther {
			sp.Route = routeNames[ex.rt]
		}
	}
	rec.traceparent = sp.Context.Append(rec.traceparent[:0])
	ctx.Request.Header.SetBytesV(tracing.Header, rec.traceparent)
}

// traceMove records in a traced request's span the try on worker w that
// moved it on to another worker, and why (reason; status: its answer's).
func (ex *exchange) traceMove(w *dataplane.Worker, reason string, status int) {
	if ex.traced {
		ex.trace.AddMove(tracing.Move{At: time.Since(ex.start), Worker: w.ID(), Reason: reason, Status: status})
	}
}

// tracePrefill records in a traced request's span the end of its prefill
// leg's answer, from worker w. An SGLang leg's goroutine writes it before
// it ends, and endSpan reads it after endPrefill waited for that end.
func (ex *exchange) tracePrefill(w *dataplane.Worker) {
	if ex.traced {
		ex.trace.PrefillWorker, ex.trace.Prefilled = w.ID(), time.Since(ex.start)
	}
}

// methodName is the method as OpenTelemetry's HTTP conventions record
// it: one of the methods the router proxies, or _OTHER.
func methodName(m []byte) string {
	switch string(m) {
	case http.MethodPost:
		return http.MethodPost
	case http.MethodGet:
		return http.MethodGet
	case http.MethodDelete:
		return http.MethodDelete
	}
	return "_OTHER"
}

// endSpan ends a traced request's span with its outcome o after total,
// and queues it for export.
func (ex *exchange) endSpan(o outcome, total time.Duration) {
	if !ex.traced {
		return
	}
	sp := &ex.trace.Span
	sp.Duration, sp.Status, sp.Outcome = total, ex.status, outcomeNames[o]
	sp.Worker, sp.Attempts = ex.tried(o)
	sp.Stream, sp.Sent, sp.FirstByte, sp.FirstToken = ex.stream, ex.sent, ex.firstByte, ex.firstToken
	if ex.metered {
		sp.InputTokens, sp.OutputTokens = ex.usage.charged()
	}
	sp.SetModel(ex.req.Model)
	ex.s.opts.Tracer.End(sp)
}
