package mockworker

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// call is one generation request as the mock reads it.
type call struct {
	id           int64
	model        string
	completion   bool // /v1/completions: text_completion objects
	stream       bool
	includeUsage bool
	prompt       int // prompt tokens, estimated at 4 bytes a token of the body
	maxOut       int // answer tokens
	capped       bool
	// vLLM's KV-connector roles, from the request's kv_transfer_params:
	// remoteDecode asks this worker to prefill for another's decode;
	// remotePrefill says another worker prefilled (the KV comes over).
	remoteDecode, remotePrefill bool
	// onlyPrefill: SGLang's prefill of a bootstrap room, one token.
	onlyPrefill bool
}

// transferPerToken is the simulated KV transfer time of one prompt token
// when another worker prefilled.
const transferPerToken = 2 * time.Microsecond

// bytesPerToken is the mock's tokenizer: a prompt token is 4 bytes of body.
const bytesPerToken = 4

// generate answers a generation or embedding request. It reports true when
// the answer streams on after it returns (the stream then ends the request).
func (w *Worker) generate(ctx *fasthttp.RequestCtx, path string) (streaming bool) {
	p := w.parser.Get()
	defer w.parser.Put(p)
	v, err := p.ParseBytes(ctx.PostBody())
	if err != nil {
		writeErr(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "mock: bad json")
		return false
	}
	if w.opts.FailRate > 0 && rand.Float64() < w.opts.FailRate {
		writeErr(ctx, fasthttp.StatusInternalServerError, "server_error", "mock: injected failure")
		return false
	}
	c := call{
		id:           w.served.Add(1),
		model:        string(v.GetStringBytes("model")),
		completion:   path == "/v1/completions",
		stream:       v.GetBool("stream"),
		includeUsage: v.GetBool("stream_options", "include_usage"),
		prompt:       max(len(ctx.PostBody())/bytesPerToken, 1),
		maxOut:       w.opts.Tokens,
	}
	if kv := v.Get("kv_transfer_params"); kv != nil {
		c.remoteDecode, c.remotePrefill = kv.GetBool("do_remote_decode"), kv.GetBool("do_remote_prefill")
	}
	room, peer, bootPrefill, bootDecode := w.bootstrapRole(v)
	if bootPrefill { // its answer is dropped: one token, not streamed
		c.stream, c.maxOut, c.onlyPrefill = false, 1, true
		defer w.prefilled(room)
	}
	if bootDecode {
		if err := awaitPrefill(peer, room); err != nil {
			writeErr(ctx, fasthttp.StatusBadGateway, "server_error", "mock: "+err.Error())
			return false
		}
		c.remotePrefill = true
	}
	if path == "/v1/embeddings" {
		w.embeddings(ctx, v, c.model)
		return false
	}
	if msg := w.overContext(c.prompt, v); msg != "" {
		if w.opts.MetricsDialect == "llamacpp" { // llama-server's refusal
			ctx.SetStatusCode(fasthttp.StatusBadRequest)
			ctx.SetContentType("application/json")
			ctx.SetBody(fmt.Appendf(nil, `{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it",`+
				`"type":"exceed_context_size_error","n_prompt_tokens":%d,"n_ctx":%d}}`, c.prompt, w.opts.MaxModelLen))
			return false
		}
		writeErr(ctx, fasthttp.StatusBadRequest, "BadRequestError", msg)
		return false
	}
	src, err := w.tokenSource(ctx, v, &c)
	if err != nil {
		writeErr(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "mock: "+err.Error())
		return false
	}
	if c.stream {
		w.stream(ctx, c, src)
		return true
	}
	n := 0
	for src.next(n) {
		n++
	}
	src.end()
	if src.gone() {
		return false // the client went away; nobody reads an answer
	}
	ctx.SetContentType("application/json")
	text := make([]byte, 0, 8*n)
	for i := 0; i < n; i++ {
		text = fmt.Appendf(text, "tok%d ", i)
	}
	finish := c.finishReason(n)
	var body []byte
	if c.completion {
		body = fmt.Appendf(nil,
			`{"id":"cmpl-%d","object":"text_completion","created":%d,"model":%q,"worker":%d,"choices":[{"index":0,"text":%q,"finish_reason":%q}],"usage":%s`,
			c.id, time.Now().Unix(), c.model, w.opts.ID, text, finish, c.usage(n))
	} else {
		body = fmt.Appendf(nil,
			`{"id":"chatcmpl-%d","object":"chat.completion","created":%d,"model":%q,"worker":%d,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":%q}],"usage":%s`,
			c.id, time.Now().Unix(), c.model, w.opts.ID, text, finish, c.usage(n))
	}
	if c.remoteDecode { // where the decode worker fetches this prompt's KV cache
		host, port, _ := net.SplitHostPort(w.Addr())
		body = fmt.Appendf(body, `,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"mock-%d","remote_block_ids":[%d],"remote_host":%q,"remote_port":%s}`,
			w.opts.ID, c.id, host, port)
	}
	ctx.SetBody(append(body, '}'))
	return false
}

// overContext says, as vLLM does in its 400, why a request of prompt tokens
// asking for the body v's max_tokens (or max_completion_tokens) does not
// fit the worker's context (Options.MaxModelLen); "" when it fits or the
// worker sets no context length. As llama-server, only a prompt too long
// for the context is refused.
func (w *Worker) overContext(prompt int, v *fastjson.Value) string {
	limit := w.opts.MaxModelLen
	if limit <= 0 {
		return ""
	}
	if prompt >= limit {
		return fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. "+
			"Please reduce the length of the input messages.", limit, prompt)
	}
	if w.opts.MetricsDialect == "llamacpp" {
		return "" // llama-server generates until its context is full
	}
	for _, key := range []string{"max_completion_tokens", "max_tokens"} {
		if m := v.GetInt(key); m > 0 {
			if m > limit-prompt {
				return fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens "+
					"and your request has %d input tokens (%d > %d - %d).", m, limit, prompt, m, limit, prompt)
			}
			break
		}
	}
	return ""
}

func (c *call) finishReason(n int) string {
	if c.capped && n >= c.maxOut {
		return "length"
	}
	return "stop"
}

func (c *call) usage(n int) []byte {
	return fmt.Appendf(nil, `{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, c.prompt, n, c.prompt+n)
}

// tokens yields an answer's tokens as they are generated.
type tokens interface {
	// next blocks until token i exists; false: the answer has no token i.
	next(i int) bool
	// gone reports that the client closed its connection.
	gone() bool
	// end releases what the answer holds (the engine's slot).
	end()
}

// tokenSource returns the timed source of the plain mock, or submits the
// request to the simulated engine.
func (w *Worker) tokenSource(ctx *fasthttp.RequestCtx, v *fastjson.Value, c *call) (tokens, error) {
	if w.engine == nil {
		return &timedTokens{n: c.maxOut, interval: w.opts.TokenInterval, sent: &w.tokens}, nil
	}
	for _, key := range []string{"max_completion_tokens", "max_tokens"} {
		if m := v.GetInt(key); m > 0 {
			c.maxOut, c.capped = m, true
			break
		}
	}
	if c.onlyPrefill {
		c.maxOut = 1
	}
	lora := ""
	if slices.Contains(w.opts.LoRAs, c.model) {
		lora = c.model
	}
	prompt := c.prompt
	var prefix []uint64
	if w.engine.cache != nil {
		prefix = promptBlocks(v, w.engine.o.BlockSize*bytesPerToken)
	}
	if c.remotePrefill { // the KV cache comes over instead of a prefill
		time.Sleep(time.Duration(prompt) * transferPerToken)
		prompt = 1
	}
	s, err := w.engine.submit(prompt, c.maxOut, lora, prefix, c.remotePrefill)
	if err != nil {
		return nil, err
	}
	return &engineTokens{e: w.engine, s: s, client: watchClient(ctx.Conn())}, nil
}

// timedTokens is the plain mock's answer: n tokens, interval apart.
type timedTokens struct {
	n        int
	interval time.Duration
	sent     interface{ Add(uint64) uint64 }
}

func (t *timedTokens) next(i int) bool {
	if i >= t.n {
		return false
	}
	if t.interval > 0 {
		time.Sleep(t.interval)
	}
	t.sent.Add(1)
	return true
}

func (t *timedTokens) gone() bool { return false }
func (t *timedTokens) end()       {}

// engineTokens follows one request through the simulated engine.
type engineTokens struct {
	e      *engine
	s      *seq
	client *clientWatch
}

func (t *engineTokens) next(i int) bool {
	for {
		n, done := t.s.tokens(t.e)
		if i < n {
			return true
		}
		if done {
			return false
		}
		select {
		case <-t.s.notify:
		case <-t.client.closed:
			t.e.drop(t.s)
			return false
		}
	}
}

func (t *engineTokens) gone() bool {
	select {
	case <-t.client.closed:
		return true
	default:
		return false
	}
}

func (t *engineTokens) end() {
	t.client.stop()
	t.e.drop(t.s) // no-op once finished
}

// clientWatch notices a client closing its connection while the answer is
// still being prepared, as a server with a background read does (Go's
// net/http, uvicorn). It reads the idle connection: a keep-alive client
// sends nothing before the answer ends, so a read that returns means the
// client closed (or pipelined, which the mock's clients never do).
type clientWatch struct {
	conn   net.Conn
	closed chan struct{}
	done   chan struct{}
}

func watchClient(c net.Conn) *clientWatch {
	w := &clientWatch{conn: c, closed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var b [1]byte
		_, err := c.Read(b[:])
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			close(w.closed)
		}
	}()
	return w
}

// stop ends the watch before the server reads the connection again.
func (w *clientWatch) stop() {
	_ = w.conn.SetReadDeadline(time.Now())
	<-w.done
	_ = w.conn.SetReadDeadline(time.Time{})
}

func (w *Worker) stream(ctx *fasthttp.RequestCtx, c call, src tokens) {
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	id := w.opts.ID
	ctx.SetBodyStreamWriter(func(bw *bufio.Writer) {
		defer w.active.Add(-1)
		defer src.end()
		created := time.Now().Unix()
		n := 0
		for ; src.next(n); n++ {
			if c.completion {
				fmt.Fprintf(bw, "data: {\"id\":\"cmpl-%d\",\"object\":\"text_completion\",\"created\":%d,\"model\":%q,\"worker\":%d,\"choices\":[{\"index\":0,\"text\":\"tok%d \",\"finish_reason\":null}]}\n\n", c.id, created, c.model, id, n)
			} else {
				fmt.Fprintf(bw, "data: {\"id\":\"chatcmpl-%d\",\"object\":\"chat.completion.chunk\",\"created\":%d,\"model\":%q,\"worker\":%d,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", c.id, created, c.model, id, n)
			}
			if bw.Flush() != nil {
				return // client went away; end drops the request
			}
		}
		if src.gone() {
			return
		}
		if c.includeUsage {
			object := "chat.completion.chunk"
			if c.completion {
				object = "text_completion"
			}
			fmt.Fprintf(bw, "data: {\"id\":\"cmpl-%d\",\"object\":%q,\"created\":%d,\"model\":%q,\"choices\":[],\"usage\":%s}\n\n", c.id, object, created, c.model, c.usage(n))
		}
		bw.WriteString("data: [DONE]\n\n")
		_ = bw.Flush()
	})
}

func (w *Worker) embeddings(ctx *fasthttp.RequestCtx, v *fastjson.Value, model string) {
	inputs := 1
	if arr, err := v.Get("input").Array(); err == nil {
		inputs = len(arr)
	}
	// The vector's first element names the worker: 0.<id>.
	first, _ := strconv.ParseFloat("0."+strconv.FormatUint(w.opts.ID, 10), 64)
	vec := []float64{first, 0.5, 0.25}
	var enc []byte
	if string(v.GetStringBytes("encoding_format")) == "base64" {
		// The OpenAI clients' default: little-endian float32s, base64.
		raw := make([]byte, 0, 4*len(vec))
		for _, f := range vec {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(float32(f)))
		}
		enc = strconv.AppendQuote(nil, base64.StdEncoding.EncodeToString(raw))
	} else {
		enc = fmt.Appendf(nil, "[%v,%v,%v]", vec[0], vec[1], vec[2])
	}
	b := []byte(`{"object":"list","data":[`)
	for i := 0; i < inputs; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"object":"embedding","index":%d,"embedding":%s}`, i, enc)
	}
	b = fmt.Appendf(b, `],"model":%q,"worker":%d,"usage":{"prompt_tokens":%d,"total_tokens":%d}}`,
		model, w.opts.ID, inputs, inputs)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func writeErr(ctx *fasthttp.RequestCtx, status int, typ, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(fmt.Appendf(nil, `{"error":{"message":%q,"type":%q,"code":%d}}`, msg, typ, status))
}
