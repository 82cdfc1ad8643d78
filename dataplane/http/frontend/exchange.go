package frontend

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fastroute/fastroute/affinity"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/http/hangup"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// promptCacheKey is the body field of OpenAI's chat completions and
// Responses API that names a request's prompt cache (readRouting).
const promptCacheKey = "prompt_cache_key"

// Request headers the front end reads.
const (
	headerWorkerID = "x-worker-id"
	headerDPRank   = "x-dp-rank"
	headerQuery    = "x-query-instance-id"
	// headerEngineRank is the data-parallel rank as vLLM
	// (_get_data_parallel_rank) and SGLang read it: the worker gets the
	// rank the router chose in it, and in headerDPRank.
	headerEngineRank = "X-Data-Parallel-Rank"
	headerServedBy   = "X-Fastroute-Worker" // as fasthttp normalizes it: set as it is (servedByKey)
)

var eventStream = []byte("text/event-stream")

// servedByKey is headerServedBy, set on each answer without normalizing
// it again (SetCanonical).
var servedByKey = []byte(headerServedBy)

// http11 is the protocol of every answer to a client, whatever the
// worker's was (an HTTP/1.0 worker's would tell an HTTP/1.1 client to
// ignore the chunks its answer of unknown length is framed in).
var http11 = []byte("HTTP/1.1")

// exchange is the pooled state of one proxied request. A streamed answer
// ends it from the goroutine that sends it (sendStream).
type exchange struct {
	s       *Server
	pol     *policy // the front end's policy as this request began
	rt      route
	start   time.Time
	req     dataplane.Request
	res     dataplane.Reservation
	key     *apikeys.Client // the client whose API key the request presented (admit); nil: none
	keyHeld bool            // the request holds one of key's slots
	usage   tokenUsage      // what the answer says it used, read while metered (inspect), charged to key at the end
	metered bool            // the answer's usage is charged to key: a request with a key, but for one about a stored response
	upCall                  // the request to the (decode) worker

	// A request split between a prefill and a decode worker (Disagg).
	split    bool
	whole    dataplane.Split            // why a request that would split runs whole (selectSplit); SplitLegs: it did not
	decoding bool                       // its decode leg was dispatched
	pre      atomic.Pointer[prefillLeg] // made at the first request that may split (prefillLeg)
	body     []byte                     // the body sent to the decode worker; nil: the client's
	aliased  []byte                     // the client's body with an alias's target for its model (applyAlias)
	alias    []byte                     // the alias the client named, copied while the access log is on (applyAlias); empty: none
	stream   bool
	creates  bool // a POST /v1/responses: its answer may store a response (learnStored)
	generate bool // a POST /generate (SGLang's native API): its prompt is the body's text
	created  bool // its answer streams, and its first event is still to be read (learnStreamed)
	readErr  error
	done     bool
	rankBuf  []byte
	answer   []byte // a buffered answer's body is read into it (readWhole)
	sse      bool   // the answer is an event stream
	tail     []byte // the error event still to send after a broken stream
	relay    chunkRelay
	prompt   affinity.PrefixHasher // keys the prompt's prefixes (readPrompt)

	// timed: the answer is an event stream of generated tokens (chat,
	// completions, /generate), whose time to first token and time per
	// token are observed (firstTokenLeaves, observeTokenPace);
	// firstToken: when its first event left, since start (0: none yet).
	timed      bool
	firstToken time.Duration
	sent       time.Duration // when the request left for its (decode) worker, since start: its last try's
	// tokensOf: the worker whose answer this is, while the router reads
	// its load itself (Worker.CountsTokens): the tokens relayed count on
	// it, and the gaps between them; lastToken: when the last of them
	// came, since start (0: none yet). nil: none.
	tokensOf  *dataplane.Worker
	lastToken time.Duration
	// model: the metrics of the model the request is routed as, once known
	// (Server.forward); nil before.
	model  *modelStats
	copied *mirrors.Rule // the mirror a copy of the request went by (mirror); nil: none

	// traced: the request is traced, its span in trace (traceRequest).
	traced bool
	trace  *spanRecord

	// Its place in the retry budget's counts: among the requests holding a
	// worker (holdWorker), and among those on a retry (mayRetry).
	inBudget, onRetry bool

	// The client's connection taken over from fasthttp (takeOver).
	ctx           *fasthttp.RequestCtx // the client's, once taken over; nil: the exchange runs in fasthttp's handler
	head          []byte               // a streamed answer's response head, sent with its first chunk
	beginStreamFn fasthttp.HijackHandler
	runTakenFn    fasthttp.HijackHandler
	runTunnelFn   fasthttp.HijackHandler
	queueTimer    *time.Timer // awaitSlot's, made at its first wait
	priority      int64       // the body's priority (vLLM's: lower is sooner), or its API key's, which orders the wait queue
	keyPriority   bool        // priority is the API key's: the body's is not read
	place         waiter      // the request's place in the wait queue

	// Client hang-up while the worker works (watchClient to unwatch).
	client hangup.Conn   // the client connection, while watched
	token  uint32        // owner token of conn: the client connection's generation, or 1
	watch  atomic.Uint64 // token<<1 while watched, | 1 once the client hung up
	stop   atomic.Uint32 // why the upstream calls stop early (stopHungUp, stopPrefill); 0: they run

	// For the access log.
	path       []byte // copied only while the access log is on for this request, as are method, peer, clientAt, requestID and clientCert
	method     []byte
	peer       net.Addr       // the connection's peer, where it has no IP address (clientAt is not valid)
	clientAt   netip.AddrPort // the client's address (policy.clientOf), for the span too
	requestID  []byte         // the request's X-Request-Id: the client's, or one made up (GenerateRequestIDs)
	picked     bool           // res names this request's worker (it may name an earlier one's)
	status     int
	firstByte  time.Duration
	bytes      int64
	clientCert []byte // the client as its certificate names it (policy.certName); empty for none

	forwardedFor []byte // the X-Forwarded-For sent on (AddXForwardedFor): addForwardedFor's scratch
}

func (ex *exchange) begin(ctx *fasthttp.RequestCtx, rt route, start time.Time) {
	ex.rt, ex.start, ex.key, ex.keyHeld, ex.metered = rt, start, nil, false, false
	ex.usage.reset()
	ex.req.Reset()
	ex.stream, ex.readErr, ex.done = false, nil, false
	ex.sse, ex.tail, ex.bodyDone, ex.client, ex.created = false, nil, false, hangup.Conn{}, false
	ex.timed, ex.firstToken, ex.sent, ex.alias, ex.model, ex.copied, ex.tokensOf, ex.lastToken = false, 0, 0, ex.alias[:0], nil, nil, nil, 0
	ex.watch.Store(0)
	ex.stop.Store(0)
	ex.split, ex.whole, ex.decoding, ex.body = false, dataplane.SplitLegs, false, nil
	ex.ctx, ex.priority, ex.keyPriority = nil, 0, false
	if pre := ex.pre.Load(); pre != nil {
		pre.done, pre.err = nil, nil
	}
	ex.picked, ex.status, ex.firstByte, ex.bytes = false, 0, 0, 0
	ex.pol = ex.s.policy.Load()
	if ex.pol.GenerateRequestIDs {
		stampRequestID(ctx)
	}
	if ex.pol.Access != AccessOff {
		ex.path = append(ex.path[:0], ctx.Path()...)
		ex.method = append(ex.method[:0], ctx.Method()...)
		ex.requestID = append(ex.requestID[:0], ctx.Request.Header.Peek(headerRequestID)...)
		var ok bool
		if ex.clientAt, ok = ex.pol.clientOf(ctx); !ok {
			ex.peer = ctx.RemoteAddr()
		}
		// The name's own buffer is certName's scratch too: an escaped
		// name it unescapes there is copied onto itself.
		ex.clientCert = append(ex.clientCert[:0], ex.pol.certName(ctx, ex.clientCert[:0])...)
	}
	if ex.pol.ForwardedCertFrom != nil {
		// The client's certificate, as a proxy named it, stays with the
		// router, as its API key does.
		ctx.Request.Header.Del(headerForwardedClientCert)
	}
	ex.traceRequest(ctx, start)
	if ex.pol.AddXForwardedFor {
		ex.forwardedFor = addForwardedFor(&ctx.Request.Header, ctx.RemoteAddr(), ex.forwardedFor)
	}
}

// pick selects and reserves the request's worker, both of a split
// request's.
func (ex *exchange) pick() error {
	if ex.split {
		return ex.selectSplit()
	}
	return ex.s.sel.Select(&ex.req, &ex.res)
}

// parse reads the routing headers (the session's among them) and what
// routes the body: a JSON object's fields (which the chat, completions and
// embeddings routes require), or a form's model field.
func (ex *exchange) parse(ctx *fasthttp.RequestCtx) (query bool, err error) {
	h := &ctx.Request.Header
	if k := spacedFieldName(h.RawHeaders()); k != nil {
		return false, fmt.Errorf("header field name %q holds a space; a field name is a token (RFC 9110 section 5.1)", k)
	}
	if v := h.Peek(headerWorkerID); len(v) > 0 {
		id, err := fasthttp.ParseUint(v)
		if err != nil || id == 0 {
			return false, fmt.Errorf("header %s: %q is not a positive integer worker id", headerWorkerID, v)
		}
		ex.req.WorkerID = uint64(id)
	}
	if v := h.Peek(headerDPRank); len(v) > 0 {
		rank, err := fasthttp.ParseUint(v)
		if err != nil {
			return false, fmt.Errorf("header %s: %q is not a non-negative integer", headerDPRank, v)
		}
		if ex.req.WorkerID == 0 {
			return false, fmt.Errorf("header %s names a rank of the worker that %s names; send both", headerDPRank, headerWorkerID)
		}
		ex.req.DPRank, ex.req.HasDPRank = rank, true
	}
	switch v := h.Peek(headerQuery); string(v) { // strconv.ParseBool's words (Python's str(True) is "True")
	case "", "false", "False", "FALSE", "f", "F", "0":
	case "true", "True", "TRUE", "t", "T", "1":
		query, ex.req.Query = true, true
	default:
		return false, fmt.Errorf("header %s: %q is not true or false", headerQuery, v)
	}
	if ex.pol.Disagg.Protocol != ProtocolOff {
		if err := ex.parseDisagg(h, len(ctx.PostBody())); err != nil {
			return false, err
		}
	}
	if rt := ex.s.sel.Routing(); rt.WantsSession() {
		ex.req.Session = append(ex.req.Session[:0], h.Peek(rt.SessionHeader)...)
	}
	body := ctx.PostBody()
	ex.usage.bodyBytes = int64(len(body))
	strict := ex.rt.strict()
	switch {
	case len(body) == 0 && strict:
		return false, errors.New("request body is empty; want a JSON object")
	case len(body) == 0:
		return query, nil
	case !strict && isForm(h.ContentType()):
		return query, ex.readForm(h.ContentType(), body)
	case strict && coded(h.ContentEncoding()):
		return false, fmt.Errorf("request body has Content-Encoding %q: %w", h.ContentEncoding(), errCodedBody)
	}
	p := ex.s.parsers.Get()
	defer ex.s.parsers.Put(p)
	v, err := p.ParseBytes(body)
	switch {
	case err != nil:
		err = fmt.Errorf("request body is not valid JSON: %v", err)
	case v.Type() != fastjson.TypeObject:
		err = errors.New("request body must be a JSON object")
	}
	if err != nil {
		if !strict {
			return query, nil // not JSON: forwarded as it is, routed without a model
		}
		return false, err
	}
	ex.stream = v.GetBool("stream")
	return query, ex.readRouting(v)
}

// errCodedBody refuses a body sent compressed (Content-Encoding: gzip...)
// on a route whose JSON the router reads to route it: it decodes none, and
// nor do vLLM and SGLang. Answered 415 with Accept-Encoding: identity, as
// RFC 9110 (section 15.5.16) has it for a content coding not accepted.
var errCodedBody = errors.New("the router reads this route's JSON body and decodes no content coding; send it uncompressed")

// coded reports a Content-Encoding other than none or identity.
func coded(coding []byte) bool {
	return len(coding) > 0 && !bytes.EqualFold(coding, []byte("identity"))
}

// isForm reports a multipart/form-data body, as OpenAI's audio routes take
// (transcriptions, translations: the audio file beside fields).
func isForm(contentType []byte) bool {
	const form = "multipart/form-data"
	return len(contentType) >= len(form) && bytes.EqualFold(contentType[:len(form)], []byte(form))
}

// maxFormModel bounds a form's model field.
const maxFormModel = 1 << 10

// readForm reads the model field of a multipart/form-data body, which
// routes it as a JSON body's model does (an audio model's workers, an
// adapter's holders). The form is read to its end, so that a second
// model field is refused (onlyMember) rather than routed by the first and
// served by the last; a form the router cannot read goes as it is, routed
// by the model read before the fault (none: without one), for its worker
// to judge. Unlike a JSON body's, this read allocates (mime/multipart).
func (ex *exchange) readForm(contentType, body []byte) error {
	_, params, err := mime.ParseMediaType(string(contentType))
	if err != nil || params["boundary"] == "" {
		return nil
	}
	r := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	found := false
	for {
		part, err := r.NextPart()
		if err != nil {
			return nil
		}
		if part.FormName() != "model" {
			continue
		}
		if found { // as onlyMember: Starlette's form serves the last
			ex.req.Model = ex.req.Model[:0]
			return errors.New(`form field "model" appears more than once`)
		}
		b, err := io.ReadAll(io.LimitReader(part, maxFormModel+1))
		switch {
		case err != nil:
			return nil
		case len(b) > maxFormModel:
			return fmt.Errorf("form field \"model\" is longer than %d bytes", maxFormModel)
		}
		ex.req.Model = append(ex.req.Model[:0], b...)
		found = true
	}
}

// readRouting copies what in a JSON body routes a request into its
// selection request: the model (a LoRA adapter, maybe), the
// prompt_cache_key (or an Anthropic request's metadata.user_id) of a
// request without a session header as its session hint, a stored response
// it continues, the prompt's prefix keys, the embedding inputs' cache keys
// and the priority that orders the wait queue, each only when routing uses
// it. It copies into the request's reused buffers, so it allocates nothing
// once they have grown.
func (ex *exchange) readRouting(v *fastjson.Value) error {
	rt := ex.s.sel.Routing()
	m, err := onlyMember(v, "model")
	if err != nil {
		return err
	}
	if m != nil {
		b, err := m.StringBytes()
		if err != nil {
			return errors.New(`field "model" must be a string`)
		}
		ex.req.Model = append(ex.req.Model[:0], b...)
	}
	if rt.WantsSession() && !rt.WantsPrefixKeys() && len(ex.req.Session) == 0 {
		// OpenAI's hint for its prompt cache, which routes the requests
		// that share one to one machine while it keeps up, or an Anthropic
		// request's user (Claude Code's names its session): a session
		// hint here (one longer than a session id may be is not read).
		// With prefix affinity on, the prompt's own prefixes route instead.
		k := v.GetStringBytes(promptCacheKey)
		if k == nil && ex.rt == routeMessages {
			k = v.GetStringBytes("metadata", "user_id")
		}
		if len(k) > 0 && len(k) <= dataplane.MaxSessionID {
			ex.req.Session = append(ex.req.Session, k...)
			ex.req.SessionHint = true
		}
	}
	if ex.creates {
		if p := v.Get("previous_response_id"); p != nil && p.Type() != fastjson.TypeNull {
			b, err := p.StringBytes()
			if err != nil {
				return errors.New(`field "previous_response_id" must be a string`)
			}
			ex.req.Response = append(ex.req.Response[:0], b...)
		}
	}
	if rt.WantsPrefixKeys() {
		ex.readPrompt(rt, v)
	}
	if ex.s.queue.on() && !ex.keyPriority { // the body is searched for it only while the queue is on
		if p := v.Get("priority"); p != nil {
			ex.priority, _ = p.Int64() // not an integer: 0, and the worker judges it
		}
	}
	if ex.rt != routeEmbeddings || !rt.WantsCacheKeys() {
		return nil
	}
	in := v.Get("input")
	if in == nil {
		return nil
	}
	switch in.Type() {
	case fastjson.TypeString:
		ex.req.CacheKeys = append(ex.req.CacheKeys, affinity.Key(in.GetStringBytes()))
	case fastjson.TypeArray:
		arr, _ := in.Array()
		for _, e := range arr {
			if len(ex.req.CacheKeys) == dataplane.MaxCacheKeys {
				break
			}
			if b, err := e.StringBytes(); err == nil { // token-id inputs are not tracked
				ex.req.CacheKeys = append(ex.req.CacheKeys, affinity.Key(b))
			}
		}
	}
	return nil
}

// onlyMember returns the value of the member name of the JSON object v
// (nil: none), or an error when v has it more than once, its name
// escaped or not. Python's json module, under vLLM and SGLang, takes the
// last of a name given twice and fastjson's Get the first, so a body
// naming two models would be routed, and checked against its API key's
// models, by one and served by the other; serde, under SGLang's router,
// refuses it too.
func onlyMember(v *fastjson.Value, name string) (*fastjson.Value, error) {
	o, err := v.Object()
	if err != nil {
		return nil, nil
	}
	var found *fastjson.Value
	twice := false
	o.Visit(func(k []byte, m *fastjson.Value) {
		if string(k) == name {
			twice = twice || found != nil
			found = m
		}
	})
	if twice {
		return nil, fmt.Errorf("field %q appears more than once", name)
	}
	return found, nil
}

// run sends the request, after its prefill when it is split; streamed: the
// answer streams (respond).
func (ex *exchange) run(ctx *fasthttp.RequestCtx) (streamed bool) {
	if ex.split && !ex.prefill(ctx) {
		return false
	}
	return ex.dispatch(ctx)
}

// dispatch sends the request to the reserved worker, moving it to another
// one on a transport failure before the first response byte.
func (ex *exchange) dispatch(ctx *fasthttp.RequestCtx) (streamed bool) {
	s := ex.s
	ex.decoding = ex.split
	for {
		w := ex.res.Worker()
		u := s.upstreamOf(w)
		ex.prepare(ctx, u, w)
		ex.res.Dispatched()
		t := time.Now()
		ex.sent = t.Sub(ex.start)
		err := ex.send(u, ex.token, t, &ex.pol.Limits, &ex.stop)
		if err == nil {
			ex.headCame(u, w, t)
			if why := ex.movesOn(w); why != stays {
				if !ex.readWhole(ctx, w) {
					return false
				}
				ex.endConn(ex.token) // read to its end: the connection goes back to its pool
				if (why == moveStatus && !ex.mayRetry()) ||
					(why == moveContext && !(refusedAsLonger(ctx.Response.Body()) && s.sel.LongerContext(&ex.req, w))) {
					ex.sendWhole(ctx, u) // the client gets this answer
					return false
				}
				rerr := s.sel.Retry(&ex.req, &ex.res)
				switch {
				case rerr == nil:
					ex.traceMove(w, "status", ex.resp.StatusCode())
					ctx.Response.ResetBody()
					s.metrics.moved(why)
					continue
				case why == moveSearch && errors.Is(rerr, dataplane.ErrResourceExhausted):
					// The response may be on a busy worker: not a 404.
					ctx.Response.ResetBody()
					writeSelectError(ctx, rerr)
					ex.status = ctx.Response.StatusCode()
					ex.finish(outcomeExhausted)
					return false
				}
				ex.sendWhole(ctx, u) // no other worker: the client gets this answer
				return false
			}
			s.sel.Answered(&ex.req, &ex.res)
			ex.noteStored()
			return ex.respond(ctx, u, w)
		}
		if !ex.moveAfter(ctx, u, w, err) {
			return false
		}
	}
}

// headCame records the answer head of worker w (of upstream u) to the
// request sent at sent: its time to first byte, its status in the
// worker's counts and the passive health check (a 5xx counts against it).
func (ex *exchange) headCame(u *upstream, w *dataplane.Worker, sent time.Time) {
	s, status := ex.s, ex.resp.StatusCode()
	ex.firstByte = time.Since(sent)
	s.metrics.firstByte.Observe(ex.firstByte)
	u.stats.answered(status, ex.firstByte)
	s.reportAnswer(w, status < fasthttp.StatusInternalServerError)
}

// moveAfter moves the request to another worker after the call to worker
// w (of upstream u) failed with err before any answer, counted against
// the worker; false: it does not move (its client left, err is no
// transport failure before an answer, no try or retry budget is left, or
// no other worker takes it), and the client has its answer.
func (ex *exchange) moveAfter(ctx *fasthttp.RequestCtx, u *upstream, w *dataplane.Worker, err error) bool {
	s := ex.s
	if ex.endStopped(ctx) {
		return false
	}
	failed := failureOf(err)
	u.stats.failed(failed)
	s.reportAnswer(w, false)
	if !retryable(err) || int64(ex.req.Attempts()) >= s.retries.Load() {
		ex.fail(ctx, w.ID(), err, nil)
		return false
	}
	if !ex.mayRetry() {
		ex.fail(ctx, w.ID(), err, errRetryBudget)
		return false
	}
	s.metrics.retries.Inc()
	if rerr := s.sel.Retry(&ex.req, &ex.res); rerr != nil {
		ex.fail(ctx, w.ID(), err, rerr)
		return false
	}
	ex.traceMove(w, failureNames[failed], 0)
	return true
}

// prepare makes the client's request the worker's: it is sent as it is,
// edited for the worker, not copied (the proxy reads nothing of it after).
func (ex *exchange) prepare(ctx *fasthttp.RequestCtx, u *upstream, w *dataplane.Worker) {
	var reqID []byte
	if ex.split {
		reqID = ex.pre.Load().reqID
	}
	ex.up = &ctx.Request
	ex.upCall.prepare(u, w, ctx.RequestURI(), ex.body, reqID, ex.res.Rank(), &ex.rankBuf)
}

// originForm returns a request target in origin form (/path?query): one
// in absolute form (http://host/path?query, which a client may send any
// server, RFC 9112 §3.2.2) without its scheme and host, which would
// otherwise name the client's idea of a host to the worker (an engine's
// HTTP server takes the host from such a target, not from Host), as nginx
// and Go's reverse proxy do. Any other target is returned as it is.
func originForm(uri []byte) []byte {
	if len(uri) == 0 || uri[0] == '/' {
		return uri
	}
	_, rest, ok := bytes.Cut(uri, []byte("://"))
	if !ok {
		return uri
	}
	switch i := bytes.IndexAny(rest, "/?"); {
	case i < 0:
		return []byte("/")
	case rest[i] == '?':
		return append([]byte("/"), rest[i:]...)
	default:
		return rest[i:]
	}
}

// prepare edits the call's request (up) for the worker: its target (the
// client's raw one, uri, in origin form: not the one fasthttp parsed,
// normalized), host, body (nil: the one it has), the request id both legs
// of a split request share (nil: none added) and the data-parallel rank of
// a worker with ranks, in the engines' header and the router's own (a
// worker without ranks gets neither, not even the client's: the rank is
// the router's to choose, x-dp-rank the client's way to ask).
func (c *upCall) prepare(u *upstream, w *dataplane.Worker, uri, body, reqID []byte, rank int, rankBuf *[]byte) {
	c.up.SetRequestURIBytes(originForm(uri))
	dropRequestHops(&c.up.Header)
	c.up.Header.SetNoDefaultContentType(true) // a body without a Content-Type is sent without one
	c.up.Header.SetHost(u.host)
	if body != nil {
		c.up.SetBodyRaw(body)
	}
	if reqID != nil {
		c.up.Header.SetBytesV(headerRequestID, reqID)
	}
	if w.Spec().DPSize > 1 {
		*rankBuf = strconv.AppendInt((*rankBuf)[:0], int64(rank), 10)
		c.up.Header.SetBytesV(headerEngineRank, *rankBuf)
		c.up.Header.SetBytesV(headerDPRank, *rankBuf)
	} else {
		c.up.Header.Del(headerEngineRank)
		c.up.Header.Del(headerDPRank)
	}
	c.resp.Reset()
	// The answer's header names pass as the worker sent them, as nginx
	// passes them, and are not normalized on the way (fasthttp's
	// Content-Type, Content-Length, Transfer-Encoding and Connection are
	// read whatever their case).
	c.resp.Header.DisableNormalizing()
}

// respond copies the worker's answer to the client: a streamed answer is
// sent on the connection taken over from fasthttp (beginStream), a
// buffered one is copied and the exchange ends at once. An answer is
// buffered when the request did not ask for a stream, it is not an event
// stream, and its length is known and at most limits.answer_buffer_bytes;
// any other passes through as it comes, so the router never holds more
// than that of one answer. streamed: the answer streams.
func (ex *exchange) respond(ctx *fasthttp.RequestCtx, u *upstream, w *dataplane.Worker) (streamed bool) {
	body := ex.resp.BodyStream()
	ex.sse = bytes.HasPrefix(ex.resp.Header.ContentType(), eventStream)
	n := ex.resp.Header.ContentLength()
	if body != nil && (ex.stream || ex.sse || n < 0 || n > ex.pol.AnswerBufferBytes) {
		// From here a client that leaves is noticed by fasthttp's next
		// write of a chunk.
		ex.unwatch()
		ex.copyHeaders(ctx, u)
		ok := ex.resp.StatusCode()/100 == 2
		ex.created = ex.creates && ex.sse && ok
		ex.timed = ex.sse && ok && (ex.rt == routeChat || ex.rt == routeCompletions || ex.generate)
		if ex.timed && w.CountsTokens() {
			ex.tokensOf = w
		}
		// A stream is never sent again: its request body (a long prompt,
		// maybe) is not held for as long as the answer streams.
		ctx.Request.ResetBody()
		ex.body = nil
		if ex.ctx == nil { // in fasthttp's handler: taken over now
			ex.takeOver(ctx, ex.beginStreamFn)
		}
		return true
	}
	if ex.readWhole(ctx, w) {
		if ex.creates {
			ex.learnStored(ctx.Response.Body())
		}
		// The tokens of an answer of a worker the router reads itself
		// count once it came whole.
		counts := w.CountsTokens() && ex.resp.StatusCode()/100 == 2
		if ex.metered || counts {
			ex.readUsage(ctx.Response.Body())
		}
		if counts {
			w.AddRelayedTokens(ex.usage.completion)
		}
		ex.sendWhole(ctx, u)
	}
	return false
}

// inspects says a streamed answer's bytes are read on their way to the
// client (inspect).
func (ex *exchange) inspects() bool { return ex.created || ex.metered || ex.timed }

// inspect reads what the router learns from a streamed answer's bytes on
// their way to the client: where a response it creates is stored
// (learnStreamed), what the answer used (readUsage, countEvents), for its
// API key, its time per token and the load of a worker the router reads
// itself (tokensOf), and when its first token leaves.
func (ex *exchange) inspect(data []byte) {
	if ex.created {
		ex.learnStreamed(data)
	}
	if ex.metered || ex.timed {
		ex.readUsage(data)
	}
	if ex.sse && (ex.metered || ex.timed) {
		before := ex.usage.events
		ex.usage.countEvents(data)
		if n := ex.usage.events - before; n > 0 && ex.tokensOf != nil {
			ex.tokensOf.AddRelayedTokens(n)
			// The n gaps since the last token came span the time since.
			now := time.Since(ex.start)
			if ex.lastToken > 0 {
				ex.tokensOf.AddRelayedGaps(n, now-ex.lastToken)
			}
			ex.lastToken = now
		}
		if ex.timed && before == 0 && ex.usage.events > 0 {
			ex.firstTokenLeaves()
		}
	}
}

// firstTokenLeaves observes the time to the first token of a timed
// stream, from the request's arrival to its first event's leaving (the
// router's queue and routing, retries, a prefill leg and the engine's
// own time to first token): the time its client waits; and, for its
// worker, from the request's leaving for it.
func (ex *exchange) firstTokenLeaves() {
	ex.firstToken = max(time.Since(ex.start), 1)
	ex.model.firstToken.Observe(ex.firstToken)
	ex.s.statsOf(ex.res.Worker()).firstToken.Observe(ex.firstToken - ex.sent)
}

// observeTokenPace observes the time per output token of a timed stream
// that ended well after total (since start): the time from its first
// event to its end over the tokens after the first, which are the
// completion tokens its usage reported, else its events (vLLM and SGLang
// send a token an event).
func (ex *exchange) observeTokenPace(total time.Duration) {
	tokens := ex.usage.completion
	if tokens < 0 {
		tokens = ex.usage.events
	}
	if ex.firstToken == 0 || tokens < 2 {
		return
	}
	ex.model.tokenPace.Observe((total - ex.firstToken) / time.Duration(tokens-1))
}

// readUsage reads the token usage an answer reports in data (tokenUsage).
// Most of a stream's events report none: a forward search for the name
// without its first quote (vectorized, where the scan's backward search
// is not, and starting with a rarer byte than a quote) passes them by, in
// a ninth of the scan's time.
func (ex *exchange) readUsage(data []byte) { ex.s.readUsage(&ex.usage, data) }

// readUsage reads into u the token usage an answer reports in data.
func (s *Server) readUsage(u *tokenUsage, data []byte) {
	if !bytes.Contains(data, usageName[1:]) {
		return
	}
	p := s.parsers.Get()
	u.scan(p, data)
	s.parsers.Put(p)
}

// countRelayed counts on w, which the router reads itself (its engine
// gives no metrics), the completion tokens a whole answer's usage says
// (a prefill leg's one).
func (s *Server) countRelayed(w *dataplane.Worker, answer []byte) {
	var u tokenUsage
	u.reset()
	s.readUsage(&u, answer)
	w.AddRelayedTokens(u.completion)
}

// learnStreamed records where the response a POST /v1/responses created
// is, from its streamed answer's first bytes, data: its first event
// (response.created) carries the response object, whose "store" and "id"
// say it as a buffered answer does (learnStored). Only the first event's
// data line is read, and only when it came whole in those bytes (vLLM
// writes an event at once); else the first request naming the id searches
// for it.
func (ex *exchange) learnStreamed(data []byte) {
	ex.created = false
	_, line, found := bytes.Cut(data, sseData)
	line, _, whole := bytes.Cut(line, newline)
	if found && whole {
		ex.recordStored(line, "response")
	}
}

var sseData, newline = []byte("data:"), []byte("\n")

// noteStored keeps where the stored response a request names is: on the
// worker that answered it, but for a 404 (it has no such response) or a
// 5xx (it may have failed before looking).
func (ex *exchange) noteStored() {
	switch st := ex.resp.StatusCode(); {
	case len(ex.req.Response) == 0 || st >= fasthttp.StatusInternalServerError:
	case st == fasthttp.StatusNotFound:
		ex.s.sel.NotStored(&ex.req)
	default:
		ex.s.sel.Stored(ex.req.Response, &ex.res)
	}
}

// learnStored records where the response a POST /v1/responses created is,
// when its worker stored it: its answer, read whole into body, is a
// response object whose "store" is true (vLLM answers false while its
// store is off, whatever the request asked). A streamed answer says it in
// its first event (learnStreamed).
func (ex *exchange) learnStored(body []byte) {
	if ex.resp.StatusCode()/100 == 2 {
		ex.recordStored(body, "")
	}
}

// recordStored records the worker as the holder of the response object
// in the JSON document doc (under key; "": doc itself) when the object
// says it was stored.
func (ex *exchange) recordStored(doc []byte, key string) {
	if ex.s.sel.Routing().Responses == nil {
		return
	}
	p := ex.s.parsers.Get()
	defer ex.s.parsers.Put(p)
	v, err := p.ParseBytes(doc)
	if err == nil && key != "" {
		v = v.Get(key)
	}
	if err == nil && v != nil && v.GetBool("store") {
		ex.s.sel.Stored(v.GetStringBytes("id"), &ex.res)
	}
}

// readWhole reads the worker's answer body whole into the client's
// response: straight from the connection's reader into a buffer of the
// exchange's, which then trades places with the response's own (SwapBody),
// so the body is copied once. Its length is known and at most
// limits.answer_buffer_bytes (respond, movesOn). False: the answer
// broke, and the client got an error.
func (ex *exchange) readWhole(ctx *fasthttp.RequestCtx, w *dataplane.Worker) bool {
	b, err := ex.readAll(ex.answer[:0], ex.pol.AnswerBufferBytes)
	if err != nil {
		ex.answer = b[:0]
		ctx.Response.ResetBody()
		if !ex.endStopped(ctx) {
			ex.s.statsOf(w).failed(failCut)
			ex.fail(ctx, w.ID(), &answerBroke{err: err}, nil)
		}
		return false
	}
	ex.answer = ctx.Response.SwapBody(b)
	return true
}

// sendWhole ends the exchange with the answer readWhole read, from worker
// upstream u.
func (ex *exchange) sendWhole(ctx *fasthttp.RequestCtx, u *upstream) {
	ex.copyHeaders(ctx, u)
	ex.bytes = int64(len(ctx.Response.Body()))
	ex.finish(outcomeOK)
}

// moveKind is why a worker's answer may move its request to another worker
// (movesOn).
type moveKind uint8

const (
	stays       moveKind = iota
	moveStatus           // its status is one of router.retry_statuses
	moveSearch           // a 404 to a request searching for a stored response
	moveContext          // a 400, from a worker of known context: if it says the request is longer, to a longer one
)

// movesOn reports whether worker w's answer may move the request to
// another worker, and why: it is a 404 to a request searching for a
// stored response, and a worker it did not try yet may hold it; its
// status is one of router.retry_statuses, a try is left and the request
// is not bound to the worker; or it is a 400 from a worker whose context
// length is known, to a request not bound to it, which moves to a worker
// of a longer context if the answer says the request is longer than the
// worker's (refusedAsLonger, Selector.LongerContext). Either way the
// answer is no event stream and of a known length the answer buffer holds
// (it is read whole first, so that the client can still get it when no
// other worker can take the request).
func (ex *exchange) movesOn(w *dataplane.Worker) moveKind {
	s := ex.s
	st := ex.resp.StatusCode()
	var why moveKind
	switch tries := ex.req.Attempts(); {
	case st == fasthttp.StatusNotFound && ex.req.Searching() && tries < dataplane.MaxAttempts-1:
		why = moveSearch
	case st >= 0 && st < len(ex.pol.retryOn) && ex.pol.retryOn[st] && ex.req.WorkerID == 0 && int64(tries) < s.retries.Load():
		why = moveStatus
	case st == fasthttp.StatusBadRequest && ex.req.WorkerID == 0 && tries < dataplane.MaxAttempts-1 && w.ContextLen() > 0:
		why = moveContext
	default:
		return stays
	}
	n := ex.resp.Header.ContentLength()
	if n < 0 || n > ex.pol.AnswerBufferBytes || bytes.HasPrefix(ex.resp.Header.ContentType(), eventStream) {
		return stays
	}
	return why
}

// longerPhrases are what engines' 400s say of a request longer than
// their context: vLLM's "maximum context length" and "maximum model
// length", SGLang's "context length", llama.cpp's "context size", OpenAI's
// code context_length_exceeded.
var longerPhrases = [][]byte{[]byte("context length"), []byte("maximum model length"), []byte("context size"), []byte("context_length_exceeded")}

// refusedAsLonger reports whether the body of an engine's 400 says the
// request is longer than the engine's context.
func refusedAsLonger(body []byte) bool {
	for _, p := range longerPhrases {
		if bytes.Contains(body, p) {
			return true
		}
	}
	return false
}

func (ex *exchange) copyHeaders(ctx *fasthttp.RequestCtx, u *upstream) {
	ex.status = ex.resp.StatusCode()
	ex.resp.Header.CopyTo(&ctx.Response.Header)
	// An answer without a Content-Type gets none (CopyTo took the worker
	// answer's default).
	ctx.Response.Header.SetNoDefaultContentType(true)
	ctx.Response.Header.SetProtocol(http11)
	ctx.Response.Header.ResetConnectionClose()
	dropAnswerHops(&ctx.Response.Header)
	dropWorkerDate(&ctx.Response.Header)
	// The router's Server, as nginx (proxy_hide_header's default) and
	// Envoy send theirs: the engine's software and version stay behind it
	// (X-Fastroute-Worker names the worker).
	ctx.Response.Header.SetServerBytes(nil)
	if ex.pol.cors != nil {
		dropAccessControl(&ctx.Response.Header)
	}
	ctx.Response.Header.SetCanonical(servedByKey, u.idHeader)
	if ex.pol.GenerateRequestIDs {
		answerRequestID(ctx)
	}
}

// readAnswer passes the worker's streamed answer through. When an event
// stream of no stated length breaks, the client first gets an SSE error
// event saying why: a stream the router cut (the worker went silent past
// stream_idle_timeout) then ends cleanly; one whose worker broke it stays
// broken for the client too. One with a Content-Length (the client's
// answer has it too) has no room for an event: it is cut, and the client
// finds it short.
func (ex *exchange) readAnswer(p []byte) (int, error) {
	if ex.tail != nil {
		n := copy(p, ex.tail)
		if ex.tail = ex.tail[n:]; len(ex.tail) == 0 {
			if isTimeout(ex.readErr) {
				return n, io.EOF
			}
			return n, ex.readErr
		}
		return n, nil
	}
	n, err := ex.resp.BodyStream().Read(p)
	ex.bytes += int64(n)
	if err == io.EOF {
		ex.bodyDone = true
	}
	if err != nil && err != io.EOF && ex.broke(err) {
		return n, nil
	}
	return n, err
}

// broke notes the error err that broke the answer's body, and readies the
// error event that ends a broken event stream of unknown length: true when
// one is to be sent (readAnswer returns it).
func (ex *exchange) broke(err error) bool {
	ex.readErr = err
	if ex.sse && ex.resp.Header.ContentLength() < 0 {
		ex.tail = ex.errorEvent(err)
		return true
	}
	return false
}

// readyChunk reports whether a Read now returns answer bytes without
// waiting: the next chunk's size line and a byte after it are buffered. (A
// Read ends at a chunk's end, with its CRLF; only what has come is taken.)
func (ex *exchange) readyChunk() bool {
	if ex.tail != nil || ex.br == nil {
		return false
	}
	b, _ := ex.br.Peek(ex.br.Buffered())
	i := bytes.IndexByte(b, '\n')
	return i >= 0 && i < len(b)-1
}

// errorEvent is the SSE event that ends a broken stream: a blank line to
// close any event the worker left half-written, then an OpenAI error.
func (ex *exchange) errorEvent(err error) []byte {
	status, typ, msg := fasthttp.StatusBadGateway, "upstream_error",
		fmt.Sprintf("worker %d broke the stream: %s", ex.res.Worker().ID(), transportFailure(err))
	if isTimeout(err) {
		status, typ = fasthttp.StatusGatewayTimeout, "upstream_timeout"
		msg = fmt.Sprintf("worker %d sent nothing for %v (limits.stream_idle_timeout); the stream is cut",
			ex.res.Worker().ID(), ex.pol.StreamIdleTimeout)
	}
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = msg, typ, status
	body, _ := json.Marshal(b)
	return append(append([]byte("\n\ndata: "), body...), "\n\n"...)
}

// endStopped ends an exchange whose upstream call failed because it was
// stopped from outside: its client left (abandon) or its SGLang prefill
// failed (failSplit). It reports false for a failure of the worker's own.
func (ex *exchange) endStopped(ctx *fasthttp.RequestCtx) bool {
	if ex.hungUp() {
		ex.abandon(ctx)
		return true
	}
	if perr := ex.prefillStopped(); perr != nil {
		ex.failSplit(ctx, perr)
		return true
	}
	return false
}

// failSplit answers a split request whose decode leg was stopped because
// its prefill leg failed.
func (ex *exchange) failSplit(ctx *fasthttp.RequestCtx, err error) {
	writeError(ctx, fasthttp.StatusBadGateway, "upstream_error", err.Error()+"; the decode request is cut")
	ex.status = fasthttp.StatusBadGateway
	ex.finish(outcomeUpstreamError)
}

// fail answers a dispatch that got no response from any worker tried.
func (ex *exchange) fail(ctx *fasthttp.RequestCtx, worker uint64, err, retryErr error) {
	reason, how := ex.failureReason(worker, err), failedHow(err)
	if perr := ex.s.sel.Unanswered(&ex.req, worker, how+" ("+reason+")"); perr != nil {
		writeSelectError(ctx, perr) // a hard session's pinned worker is gone
		ex.status = ctx.Response.StatusCode()
		ex.finish(outcomeUpstreamError)
		return
	}
	msg := fmt.Sprintf("worker %d %s: %s", worker, how, reason)
	switch {
	case retryErr == errRetryBudget:
		msg += "; " + retryErr.Error()
	case retryErr != nil:
		msg += "; no other worker to retry on: " + retryErr.Error()
	}
	if isTimeout(err) {
		writeError(ctx, fasthttp.StatusGatewayTimeout, "upstream_timeout", msg)
		ex.status = fasthttp.StatusGatewayTimeout
		ex.finish(outcomeTimeout)
		return
	}
	writeError(ctx, fasthttp.StatusBadGateway, "upstream_error", msg)
	ex.status = fasthttp.StatusBadGateway
	ex.finish(outcomeUpstreamError)
}

// finish ends the exchange once: settle, then recycle.
func (ex *exchange) finish(o outcome) {
	if ex.settle(o) {
		ex.recycle()
	}
}

// settle closes the exchange's books once: it releases the reservation,
// records the outcome and returns the upstream connection to its pool.
// False: they were closed before.
func (ex *exchange) settle(o outcome) bool {
	if ex.done {
		return false
	}
	ex.done = true
	ex.unwatch()
	if ex.split {
		ex.endPrefill()
	}
	ex.endConn(ex.token)
	ex.res.Release()
	ex.releaseBudget()
	ex.s.queue.ended()
	m := ex.s.metrics
	switch {
	case !ex.split:
		m.phases[phaseAggregated][o].Inc()
	case ex.decoding:
		m.phases[phaseDecode][o].Inc()
	}
	total := time.Since(ex.start)
	m.total.Observe(total)
	if ex.timed && o == outcomeOK {
		ex.observeTokenPace(total)
	}
	if ex.tokensOf != nil {
		// An engine that sends several tokens an event (SGLang's
		// stream_interval) says more in its usage than its events.
		ex.tokensOf.AddRelayedTokens(ex.usage.completion - ex.usage.events)
	}
	ex.report(o, total)
	return true
}

// report tells of a request that ended with outcome o after total: its
// counts by route and by model, its access line, its span; and gives its
// API key's slot back.
func (ex *exchange) report(o outcome, total time.Duration) {
	ex.s.metrics.requests[ex.rt][o].Inc()
	ex.countModel(o, total)
	ex.logAccess(o, total)
	ex.endSpan(o, total)
	ex.releaseClient()
}

// recycle returns a settled exchange to its pool.
func (ex *exchange) recycle() {
	ex.resp.Reset()
	ex.up = nil // the client's: fasthttp resets it
	ex.s.exchanges.Put(ex)
}

// abandon ends an exchange whose client closed its connection while the
// worker was still working on the request: the upstream connection is cut
// (the engine stops), the reservation released, the request counted as
// cancelled and logged with nginx's 499.
func (ex *exchange) abandon(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	ex.status = statusClientClosed
	ctx.SetStatusCode(statusClientClosed)
	ex.finish(outcomeCancelled)
}

// statusClientClosed is nginx's status of a request whose client left first.
const statusClientClosed = 499

// watchClient watches the client's connection while the request waits on
// a worker, so that a client that hangs up cuts the upstream request.
func (ex *exchange) watchClient(ctx *fasthttp.RequestCtx) {
	s := ex.s
	var c hangup.Conn
	if cc, ok := ctx.Conn().(*clientConn); ok {
		c = cc.watch
	}
	if ex.token = c.Gen(); ex.token == 0 || s.hangups == nil {
		ex.token = 1 // not watched: any owner token but 0 (none)
		return
	}
	ex.watch.Store(uint64(ex.token) << 1)
	ex.client = c
	if !s.hangups.Begin(c, ex) { // gone already
		ex.watch.Store(uint64(ex.token)<<1 | 1)
		ex.stop.Store(stopHungUp)
	}
}

// unwatch stops watching the client's connection.
func (ex *exchange) unwatch() {
	if ex.client.Gen() != 0 {
		ex.s.hangups.End(ex.client, ex)
		ex.client = hangup.Conn{}
	}
}

// hungUp reports a client that closed its connection while watched.
func (ex *exchange) hungUp() bool { return ex.watch.Load()&1 != 0 }

// Why an exchange's upstream calls stop early.
const (
	stopHungUp  = 1 + iota // the client closed its connection
	stopPrefill            // the prefill of a disaggregated request failed
)

// clientHungUp is the hangup watcher's callback: it marks the exchange
// working for the client connection of generation gen and cuts its
// upstream connections.
func clientHungUp(ex *exchange, gen uint32) {
	if ex.watch.CompareAndSwap(uint64(gen)<<1, uint64(gen)<<1|1) {
		ex.stop.CompareAndSwap(0, stopHungUp)
		ex.cut(gen)
		if pre := ex.pre.Load(); pre != nil {
			pre.cut(gen)
		}
	}
}

// end closes an exchange that was never dispatched (a bad request, no
// worker, a query-only pick): count, log, back to the pool.
func (ex *exchange) end(o outcome, status int) {
	ex.status = status
	ex.report(o, time.Since(ex.start))
	ex.s.exchanges.Put(ex)
}

// countModel counts the request's outcome o and time total under the
// model it was routed as, once that was known.
func (ex *exchange) countModel(o outcome, total time.Duration) {
	if ex.model != nil {
		ex.model.requests[o].Inc()
		ex.model.seconds.Observe(total)
	}
}

// tried returns the worker of a request that ended with outcome o, the
// last one tried (0: none was picked), and the workers it was sent to (0
// for a query-only pick).
func (ex *exchange) tried(o outcome) (worker uint64, attempts int) {
	if ex.picked {
		worker = ex.res.Worker().ID()
		if o != outcomeQuery {
			attempts = ex.req.Attempts() + 1
		}
	}
	return worker, attempts
}

// clientText is the client's address in the access log.
func (ex *exchange) clientText() string {
	if !ex.clientAt.IsValid() {
		return ex.peer.String()
	}
	var room [64]byte
	return string(appendClient(room[:0], ex.clientAt))
}

// logAccess writes the request's access line: with log.access all every
// request, with errors those answered 400 or above or that did not end well.
func (ex *exchange) logAccess(o outcome, total time.Duration) {
	log := ex.s.opts.AccessLog
	if ex.pol.Access == AccessOff || (ex.pol.Access == AccessErrors && ex.status < 400 && (o == outcomeOK || o == outcomeQuery)) {
		return
	}
	worker, attempts := ex.tried(o)
	id := ex.requestID
	if pre := ex.pre.Load(); len(id) == 0 && ex.split && pre != nil {
		id = pre.reqID // made up for a split request
	}
	attrs := [...]slog.Attr{
		slog.String("method", string(ex.method)), slog.String("path", string(ex.path)), slog.Int("status", ex.status),
		slog.String("outcome", outcomeNames[o]), slog.Uint64("worker", worker), slog.Int("attempts", attempts),
		slog.Float64("first_byte_ms", float64(ex.firstByte.Microseconds())/1000),
		slog.Float64("total_ms", float64(total.Microseconds())/1000), slog.Int64("bytes", ex.bytes),
		slog.String("model", string(ex.req.Model)), slog.String("client", ex.clientText()),
		slog.String("request_id", string(id)), {}, {}, {}, {}, {}, {}, {}, {}, {}}
	n := len(attrs) - 9
	switch pre := ex.pre.Load(); {
	case ex.split && pre != nil && ex.picked: // the prefill leg's worker, the last one tried
		attrs[n] = slog.Uint64("prefill_worker", pre.res.Worker().ID())
		n++
	case ex.whole != dataplane.SplitLegs: // a request that would split ran whole on its worker, and why
		attrs[n] = slog.String("ran_whole", splitReasons[ex.whole])
		n++
	}
	if len(ex.alias) > 0 { // the model the client named, whose target model is
		attrs[n] = slog.String("alias", string(ex.alias))
		n++
	}
	if ex.copied != nil { // a copy went to the mirror's shadow model
		attrs[n] = slog.String("mirrored_to", ex.copied.To())
		n++
	}
	if ex.traced { // the trace the router's span is in
		attrs[n] = slog.String("trace_id", hex.EncodeToString(ex.trace.Trace[:]))
		n++
	}
	if ex.firstToken > 0 {
		attrs[n] = slog.Float64("first_token_ms", float64(ex.firstToken.Microseconds())/1000)
		n++
	}
	if len(ex.clientCert) > 0 { // who the client's certificate says it is
		attrs[n] = slog.String("client_cert", string(ex.clientCert))
		n++
	}
	if ex.key != nil { // the name of the client's API key, never the key, and what the answer said it used
		attrs[n] = slog.String("api_key", ex.key.Name())
		prompt, completion := ex.usage.charged()
		attrs[n+1] = slog.Uint64("prompt_tokens", prompt)
		attrs[n+2] = slog.Uint64("completion_tokens", completion)
		n += 3
	}
	log.LogAttrs(context.Background(), slog.LevelInfo, "access", attrs[:n]...)
}

// transportFailure says in a few words how a dispatch failed, instead of
// the client library's text (fasthttp's advice to servers, say, or the
// worker's answer quoted whole: it never reaches the client).
func transportFailure(err error) string {
	_, small := errors.AsType[*fasthttp.ErrSmallBuffer](err)
	broke, broken := errors.AsType[*answerBroke](err)
	switch {
	case small:
		return "answer headers larger than the router's read buffer"
	case broken && broke.unreadable:
		return "answer headers not valid HTTP"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, fasthttp.ErrDialTimeout):
		return "connect timed out (limits.connect_timeout)"
	case isTimeout(err):
		return "no answer within limits.first_byte_timeout"
	case errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		if broken {
			return "connection closed mid-answer"
		}
		return "connection closed before the answer"
	}
	return err.Error()
}

// failedHow says when a worker's call failed, for the messages that name
// the worker: before its answer, or in it (answerBroke).
func failedHow(err error) string {
	if began(err) {
		return "broke its answer"
	}
	return "failed before answering"
}

// failureReason is transportFailure(err), the words a client and the
// selector get for worker's failure, but for an answer that stalled after
// its first byte, whose deadline depends on limits.stream_idle_timeout; an
// answer that could not be read is logged whole, since what the worker
// sent is for the operator, not the client.
func (ex *exchange) failureReason(worker uint64, err error) string {
	broke, inAnswer := errors.AsType[*answerBroke](err)
	switch {
	case inAnswer && broke.unreadable:
		ex.s.log.Warn("a worker's answer could not be read", "worker", worker, "err", err)
	case inAnswer && isTimeout(err) && ex.pol.StreamIdleTimeout > 0: // each read after the first had its own deadline
		return "nothing more came within limits.stream_idle_timeout"
	case inAnswer && isTimeout(err):
		return "the whole answer did not come within limits.first_byte_timeout"
	}
	return transportFailure(err)
}

// retryable reports a failure that may succeed on another worker: a
// connection or transport error before the answer's first byte. A timeout
// is not retried: the worker may still be working on the request; nor is
// an answer that began (answerBroke): the worker got the request.
func retryable(err error) bool {
	return !isTimeout(err) && !began(err) && !errors.Is(err, fasthttp.ErrBodyTooLarge)
}

func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) {
		return true
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
