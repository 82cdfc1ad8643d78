package frontend

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/http/disagg"
	"github.com/valyala/fasthttp"
)

// Protocol is the wire protocol of prefill/decode disaggregation.
type Protocol uint8

// The protocols.
const (
	ProtocolOff    Protocol = iota
	ProtocolVLLM            // vLLM's KV connector (NIXL): prefill, then decode with its kv_transfer_params
	ProtocolSGLang          // SGLang's bootstrap: prefill and decode at once, meeting in a room
)

// Disagg configures prefill/decode disaggregation's wire protocol; the
// zero value is off. Which requests split is routing's to say
// (dataplane.Routing.Splits).
type Disagg struct {
	Protocol Protocol
}

// Request headers of disaggregation.
const (
	headerPrefillWorker = "x-prefill-worker-id"
	headerDecodeWorker  = "x-decode-worker-id"
	headerRequestID     = "X-Request-Id"
)

// phase enumerates the legs of requests, for metric labels.
type phase uint8

const (
	phaseAggregated phase = iota // a whole request on one worker
	phasePrefill                 // the prefill leg of a split request
	phaseDecode                  // the decode leg (the client's answer) of a split request
	numPhases
)

var phaseNames = [numPhases]string{"aggregated", "prefill", "decode"}

// numSplits bounds dataplane.Split's values.
const numSplits = dataplane.SplitCached + 1

// splitReasons label fastroute_disagg_fallbacks_total by why a split
// request ran whole (dataplane.Split; SplitLegs ran split).
var splitReasons = [numSplits]string{"", "no_prefill_worker", "one_worker", "prefill_queue", "cached"}

// parseDisagg reads the phase headers of a request the front end may
// split; it decides whether it does.
func (ex *exchange) parseDisagg(h *fasthttp.RequestHeader, bodyLen int) error {
	ex.req.Phase = dataplane.PhaseDecode // prefill-only workers never take a whole request
	if v := h.Peek(headerDecodeWorker); len(v) > 0 {
		id, err := fasthttp.ParseUint(v)
		if err != nil || id == 0 {
			return fmt.Errorf("header %s: %q is not a positive integer worker id", headerDecodeWorker, v)
		}
		if ex.req.WorkerID != 0 && ex.req.WorkerID != uint64(id) {
			return fmt.Errorf("headers %s and %s name different workers", headerWorkerID, headerDecodeWorker)
		}
		ex.req.WorkerID = uint64(id)
	}
	pre := ex.prefillLeg()
	pre.req.Reset()
	pre.req.Phase, pre.req.Query = dataplane.PhasePrefill, ex.req.Query
	if v := h.Peek(headerPrefillWorker); len(v) > 0 {
		id, err := fasthttp.ParseUint(v)
		if err != nil || id == 0 {
			return fmt.Errorf("header %s: %q is not a positive integer worker id", headerPrefillWorker, v)
		}
		pre.req.WorkerID = uint64(id)
	}
	generation := ex.rt == routeChat || ex.rt == routeCompletions
	ex.split = generation && ex.s.sel.Routing().Splits(bodyLen, pre.req.WorkerID != 0)
	ex.req.PromptBytes = bodyLen
	return nil
}

// selectSplit reserves both workers of a split request, or only its
// decode worker when it runs whole there (dataplane.Selector.SelectSplit
// says why; counted).
func (ex *exchange) selectSplit() error {
	pre := ex.prefillLeg()
	split, err := ex.s.sel.SelectSplit(&ex.req, &pre.req, &ex.res, &pre.res)
	if err != nil {
		return err
	}
	if split != dataplane.SplitLegs {
		ex.split, ex.whole = false, split
		ex.s.metrics.disaggFallbacks[split].Inc()
	}
	return nil
}

// prefill runs the prefill leg of a split request before its decode leg
// (dispatch): vLLM's at once, on this goroutine; SGLang's started beside
// the decode leg. It reports false when it answered the client (an error,
// or the client left).
func (ex *exchange) prefill(ctx *fasthttp.RequestCtx) bool {
	pre := ex.prefillLeg()
	pre.reqID = append(pre.reqID[:0], ctx.Request.Header.Peek(headerRequestID)...)
	if len(pre.reqID) == 0 {
		var id [16]byte
		_, _ = rand.Read(id[:])
		pre.reqID = hex.AppendEncode(append(pre.reqID[:0], "fastroute-"...), id[:])
	}
	if ex.pol.Disagg.Protocol == ProtocolSGLang {
		return ex.startBootstrap(ctx)
	}
	return ex.prefillVLLM(ctx)
}

// prefillVLLM sends the prefill request of vLLM's protocol, moving it to
// another prefill worker on a transport failure, or to one of a longer
// context when its worker refuses it as longer than its own, and makes the
// decode body from its answer's kv_transfer_params.
func (ex *exchange) prefillVLLM(ctx *fasthttp.RequestCtx) bool {
	s := ex.s
	body, err := disagg.PrefillBody(ctx.PostBody())
	if err != nil { // parse checked the body is a JSON object: not reached
		return ex.answerPrefill(ctx, fasthttp.StatusBadRequest, "invalid_request_error", err.Error(), outcomeInvalid)
	}
	start, pre := time.Now(), ex.prefillLeg()
	for {
		w := pre.res.Worker()
		u := s.upstreamOf(w)
		pre.prepare(ctx, u, w, body, &ex.rankBuf)
		pre.res.Dispatched()
		t := time.Now()
		err := pre.send(u, ex.token, t, &ex.pol.Limits, &ex.stop)
		if err == nil {
			u.stats.answered(pre.resp.StatusCode(), time.Since(t))
			if ok, moved := ex.prefilled(ctx, w, start); !moved {
				return ok
			}
			continue
		}
		if ex.hungUp() {
			s.metrics.phases[phasePrefill][outcomeCancelled].Inc()
			ex.abandon(ctx)
			return false
		}
		u.stats.failed(failureOf(err))
		s.reportAnswer(w, false)
		if !retryable(err) || int64(pre.req.Attempts()) >= s.retries.Load() {
			return ex.prefillFailed(ctx, w, err, nil)
		}
		if !ex.mayRetry() {
			return ex.prefillFailed(ctx, w, err, errRetryBudget)
		}
		s.metrics.retries.Inc()
		if rerr := s.sel.Retry(&pre.req, &pre.res); rerr != nil {
			return ex.prefillFailed(ctx, w, err, rerr)
		}
	}
}

// prefilled reads a vLLM prefill answer: an error status passes to the
// client (a 5xx as a 502 naming the worker), an answer without
// kv_transfer_params is a 502, else the decode body carries them; ok
// reports the latter. A 400 that refuses the prompt as longer than the
// worker's context moves the leg to a prefill worker of a longer one
// instead, as a whole request moves (exchange.movesOn): moved.
func (ex *exchange) prefilled(ctx *fasthttp.RequestCtx, w *dataplane.Worker, start time.Time) (ok, moved bool) {
	s, pre := ex.s, ex.prefillLeg()
	var err error
	pre.answer, err = pre.readAll(pre.answer[:0], ex.pol.AnswerBufferBytes)
	status := pre.resp.StatusCode()
	pre.endConn(ex.token)
	pre.res.Release()
	s.metrics.prefillTime.Observe(time.Since(start))
	ex.tracePrefill(w)
	switch {
	case err != nil && ex.hungUp():
		s.metrics.phases[phasePrefill][outcomeCancelled].Inc()
		ex.abandon(ctx)
		return false, false
	case errors.Is(err, errAnswerTooLarge): // the worker answered: the limit is the router's
		s.reportAnswer(w, true)
		return ex.answerPrefill(ctx, fasthttp.StatusBadGateway, "upstream_error",
			fmt.Sprintf("prefill worker %d answered more than limits.answer_buffer_bytes (%d bytes)", w.ID(), ex.pol.AnswerBufferBytes), outcomeUpstreamError), false
	case err != nil:
		s.statsOf(w).failed(failCut)
		s.reportAnswer(w, false)
		return ex.prefillFailed(ctx, w, &answerBroke{err: err}, nil), false
	case status >= fasthttp.StatusInternalServerError:
		s.reportAnswer(w, false)
		return ex.answerPrefill(ctx, fasthttp.StatusBadGateway, "upstream_error",
			fmt.Sprintf("prefill worker %d answered %d: %s", w.ID(), status, excerpt(pre.answer)), outcomeUpstreamError), false
	case status >= fasthttp.StatusBadRequest: // the engine refused the request: the client's to see
		s.reportAnswer(w, true)
		if status == fasthttp.StatusBadRequest && ex.prefillMovesLonger(w) {
			ex.traceMove(w, "status", status)
			s.metrics.moved(moveContext)
			return false, true
		}
		s.metrics.phases[phasePrefill][outcomeOK].Inc()
		ex.status = status
		ctx.SetStatusCode(status)
		ctx.SetContentType("application/json")
		ctx.SetBody(pre.answer)
		ex.finish(outcomeOK)
		return false, false
	}
	s.reportAnswer(w, true)
	params, err := disagg.TransferParams(pre.answer)
	if err == nil {
		ex.body, err = disagg.DecodeBody(ctx.PostBody(), params)
	}
	if err != nil {
		return ex.answerPrefill(ctx, fasthttp.StatusBadGateway, "upstream_error",
			fmt.Sprintf("prefill worker %d: %v (is it a vLLM engine with a KV connector?)", w.ID(), err), outcomeUpstreamError), false
	}
	s.metrics.phases[phasePrefill][outcomeOK].Inc()
	ex.s.sel.Answered(&pre.req, &pre.res)
	if w.CountsTokens() {
		s.countRelayed(w, pre.answer)
	}
	return true, false
}

// prefillMovesLonger reports whether the prefill leg that worker w
// answered a 400 moves on: the answer refuses the prompt as longer than
// w's known context, the leg is not bound to w, a try is left, and a
// routable prefill worker of a longer context takes it (reserved).
func (ex *exchange) prefillMovesLonger(w *dataplane.Worker) bool {
	s, pre := ex.s, ex.prefillLeg()
	return pre.req.WorkerID == 0 && pre.req.Attempts() < dataplane.MaxAttempts-1 && refusedAsLonger(pre.answer) &&
		s.sel.LongerContext(&pre.req, w) && s.sel.Retry(&pre.req, &pre.res) == nil
}

// startBootstrap adds SGLang's bootstrap fields to the body and sends the
// prefill request on its own goroutine; the decode leg runs meanwhile.
// When the prefill fails, the decode request is cut and the client told.
func (ex *exchange) startBootstrap(ctx *fasthttp.RequestCtx) bool {
	pre := ex.prefillLeg()
	w := pre.res.Worker()
	var random [8]byte
	_, _ = rand.Read(random[:])
	room := disagg.Room(binary.LittleEndian.Uint64(random[:]), pre.res.Rank(), w.Spec().DPSize)
	var err error
	ex.body, err = disagg.BootstrapBody(ctx.PostBody(), w.Spec().Hostname(), w.Spec().BootstrapPort, room)
	if err != nil {
		return ex.answerPrefill(ctx, fasthttp.StatusBadRequest, "invalid_request_error", err.Error(), outcomeInvalid)
	}
	pre.prepare(ctx, ex.s.upstreamOf(w), w, ex.body, &ex.rankBuf)
	pre.done = make(chan struct{})
	go ex.bootstrapPrefill(pre, w)
	return true
}

// bootstrapPrefill is the prefill leg of an SGLang request: its answer is
// read and dropped (the client gets the decode worker's).
func (ex *exchange) bootstrapPrefill(pre *prefillLeg, w *dataplane.Worker) {
	s := ex.s
	defer close(pre.done)
	start, u := time.Now(), s.upstreamOf(w)
	pre.res.Dispatched()
	err := pre.send(u, ex.token, start, &ex.pol.Limits, &ex.stop)
	status, cut := 0, false
	if err == nil {
		status = pre.resp.StatusCode()
		u.stats.answered(status, time.Since(start))
		pre.answer, err = pre.readAll(pre.answer[:0], ex.pol.AnswerBufferBytes)
		cut = err != nil && !errors.Is(err, errAnswerTooLarge)
		if err == nil && status >= fasthttp.StatusBadRequest {
			err = fmt.Errorf("answered %d: %s", status, excerpt(pre.answer))
		}
	}
	pre.endConn(ex.token)
	pre.res.Release()
	s.metrics.prefillTime.Observe(time.Since(start))
	ex.tracePrefill(w)
	if err == nil {
		s.reportAnswer(w, true)
		s.metrics.phases[phasePrefill][outcomeOK].Inc()
		ex.s.sel.Answered(&pre.req, &pre.res)
		if w.CountsTokens() {
			s.countRelayed(w, pre.answer)
		}
		return
	}
	if ex.stop.Load() == stopHungUp {
		s.metrics.phases[phasePrefill][outcomeCancelled].Inc()
		return
	}
	switch {
	case status == 0:
		u.stats.failed(failureOf(err))
	case cut:
		u.stats.failed(failCut)
	}
	s.reportAnswer(w, status > 0 && status < fasthttp.StatusInternalServerError)
	s.metrics.phases[phasePrefill][outcomeUpstreamError].Inc()
	pre.err = fmt.Errorf("prefill worker %d failed: %s", w.ID(), ex.failureReason(w.ID(), err))
	if ex.stop.CompareAndSwap(0, stopPrefill) {
		ex.cut(ex.token) // the decode request waits for a prefill that will never come
	}
}

// prefillStopped reports the prefill failure that stopped the decode leg
// of an SGLang request, once the prefill goroutine has ended.
func (ex *exchange) prefillStopped() error {
	pre := ex.pre.Load()
	if pre == nil || pre.done == nil || ex.stop.Load() != stopPrefill {
		return nil
	}
	<-pre.done
	return pre.err
}

// endPrefill waits for an SGLang prefill leg still running (the decode
// leg ended first) and releases the prefill reservation of any split
// request.
func (ex *exchange) endPrefill() {
	pre := ex.pre.Load()
	if pre == nil {
		return
	}
	if pre.done != nil {
		<-pre.done
		pre.done = nil
	}
	pre.endConn(ex.token)
	pre.res.Release()
	ex.s.queue.ended()
}

// prefillLeg is the prefill side of an exchange's split requests.
type prefillLeg struct {
	upCall                  // the request to the prefill worker
	own    fasthttp.Request // up: a copy of the client's request (the decode leg sends the client's own)
	req    dataplane.Request
	res    dataplane.Reservation
	answer []byte        // the prefill answer
	reqID  []byte        // X-Request-Id of both legs
	done   chan struct{} // closed when an SGLang prefill leg ends; nil: none running
	err    error         // why an SGLang prefill leg failed (read after done)
}

// prepare makes the leg's request for prefill worker w: a copy of the
// client's as the client sent it (the decode leg edits the client's own),
// with body, the request id both legs share and the reserved rank.
func (pre *prefillLeg) prepare(ctx *fasthttp.RequestCtx, u *upstream, w *dataplane.Worker, body []byte, rankBuf *[]byte) {
	pre.own.Reset()
	ctx.Request.Header.CopyTo(&pre.own.Header)
	pre.up = &pre.own
	pre.upCall.prepare(u, w, ctx.RequestURI(), body, pre.reqID, pre.res.Rank(), rankBuf)
}

// prefillLeg returns the exchange's prefill leg, made at its first request
// that may split: most exchanges never split, and a leg is 2 KiB that every
// open stream would hold.
func (ex *exchange) prefillLeg() *prefillLeg {
	if pre := ex.pre.Load(); pre != nil {
		return pre
	}
	pre := &prefillLeg{}
	ex.pre.Store(pre)
	return pre
}

// prefillFailed answers a prefill that got no whole answer from any
// prefill worker tried.
func (ex *exchange) prefillFailed(ctx *fasthttp.RequestCtx, w *dataplane.Worker, err, retryErr error) bool {
	msg := fmt.Sprintf("prefill worker %d %s: %s", w.ID(), failedHow(err), ex.failureReason(w.ID(), err))
	switch {
	case retryErr == errRetryBudget:
		msg += "; " + retryErr.Error()
	case retryErr != nil:
		msg += "; no other prefill worker to retry on: " + retryErr.Error()
	}
	if isTimeout(err) {
		return ex.answerPrefill(ctx, fasthttp.StatusGatewayTimeout, "upstream_timeout", msg, outcomeTimeout)
	}
	return ex.answerPrefill(ctx, fasthttp.StatusBadGateway, "upstream_error", msg, outcomeUpstreamError)
}

// answerPrefill ends a split request whose prefill leg failed.
func (ex *exchange) answerPrefill(ctx *fasthttp.RequestCtx, status int, typ, msg string, o outcome) bool {
	ex.s.metrics.phases[phasePrefill][o].Inc()
	writeError(ctx, status, typ, msg)
	ex.status = status
	ex.finish(o)
	return false
}

// excerpt is the start of a worker's answer, for an error message.
func excerpt(b []byte) string {
	const n = 200
	if len(b) > n {
		return strconv.Quote(string(b[:n])) + "…"
	}
	return strconv.Quote(string(b))
}

// queryDisagg answers a query-only split request with both picks.
func (ex *exchange) queryDisagg(ctx *fasthttp.RequestCtx) {
	pre := ex.prefillLeg()
	b := append(ctx.Response.Body()[:0], `{"prefill_worker_id":`...)
	b = strconv.AppendUint(b, pre.res.Worker().ID(), 10)
	b = append(b, `,"decode_worker_id":`...)
	b = strconv.AppendUint(b, ex.res.Worker().ID(), 10)
	b = append(b, `,"dp_rank":`...)
	b = strconv.AppendInt(b, int64(ex.res.Rank()), 10)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(append(b, '}'))
	pre.res.Release()
}
