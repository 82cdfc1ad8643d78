// Package mockworker is an OpenAI-compatible fake inference server: it
// streams SSE tokens for chat/completions, answers the Responses API (with
// vLLM's store), embeddings, models, health and Prometheus metrics in
// vLLM's, SGLang's or llama.cpp's names, answers a browser's Origin as vLLM does, and
// can fail a share of requests. By default every answer takes the same
// time; with Engine.MaxNumSeqs set it simulates an engine's continuous
// batching, so its answers slow down and queue under load as a real
// engine's do. Tests, the demo and the benchmarks run it over real
// loopback sockets.
package mockworker

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// Options configures a mock worker.
type Options struct {
	ID            uint64
	Tokens        int           // chunks per answer
	TokenInterval time.Duration // pause before each chunk
	Model         string
	LoRAs         []string
	FailRate      float64 // share of generation requests answered 500
	// Engine simulates an inference engine's scheduler when MaxNumSeqs > 0;
	// Tokens is then the answer length of requests without max_tokens, and
	// TokenInterval is unused.
	Engine EngineOptions
	// MetricsDialect names the /metrics series: one of MetricsDialects,
	// "vllm" by default. With "llamacpp" the worker also lists its model
	// and refuses a prompt longer than MaxModelLen as llama-server does.
	MetricsDialect string
	// MetricsDelay makes /metrics answer this long after it is asked, as
	// the API server of an engine under load does (its event loop busy
	// with streams), with the figures of that moment.
	MetricsDelay time.Duration
	// NoMetrics answers /metrics 404, as SGLang started without
	// --enable-metrics and Ollama do (llama-server without --metrics
	// answers 501).
	NoMetrics bool
	// APIKey, as vLLM's --api-key, makes every /v1/ route answer 401
	// without "Authorization: Bearer <key>"; /health and /metrics stay open.
	APIKey string
	// ResponsesStore keeps the responses POST /v1/responses creates, for
	// GET /v1/responses/{id}, its cancel and previous_response_id, as vLLM
	// does with VLLM_ENABLE_RESPONSES_API_STORE=1.
	ResponsesStore bool
	// TLS, when set, has clients speak TLS to the worker (URL https://),
	// as vLLM started with --ssl-certfile and --ssl-keyfile.
	TLS *tls.Config
	// KeepAlive closes a connection that brings no request within it of
	// its last answer, as uvicorn's timeout_keep_alive (5 s under vLLM and
	// SGLang) does; 0: never.
	KeepAlive time.Duration
	// MaxModelLen is the context length in tokens (vLLM's --max-model-len):
	// /v1/models reports it, and a chat or completion request whose prompt
	// and max_tokens do not fit is refused with vLLM's 400. 0: /v1/models
	// reports DefaultMaxModelLen and nothing is refused (the tests' long
	// answers).
	MaxModelLen int
}

// DefaultMaxModelLen is the context length /v1/models reports of a worker
// that sets none.
const DefaultMaxModelLen = 8192

// MaxBodyBytes is the largest request body accepted: above the router's
// default, so the router's own limit is the one a client meets.
const MaxBodyBytes = 64 << 20

// Worker is a running mock worker.
type Worker struct {
	opts   Options
	ln     net.Listener
	srv    *fasthttp.Server
	served atomic.Int64
	active atomic.Int64
	parser fastjson.ParserPool
	conns  sync.Map      // open net.Conn → struct{}, for Kill
	engine *engine       // nil unless Engine.MaxNumSeqs > 0
	tokens atomic.Uint64 // tokens sent without the engine
	rooms  sync.Map      // SGLang bootstrap room → chan closed once prefilled
	stored sync.Map      // stored response id → its JSON (ResponsesStore)
	sleep  atomic.Int32  // the level of vLLM's sleep mode it is in (POST /sleep); 0: awake
	// realtimeFn serves GET /v1/realtime (newRealtime).
	realtimeFn fasthttp.RequestHandler
}

// MetricsDialects are the engines whose /metrics series the worker can
// speak (Options.MetricsDialect): vLLM's, SGLang's, TensorRT-LLM's
// trtllm-serve's, text-generation-inference's and llama.cpp's
// llama-server's.
var MetricsDialects = []string{"vllm", "sglang", "trtllm", "tgi", "llamacpp"}

// Start listens on addr ("127.0.0.1:0" picks a port) and serves until Close.
func Start(addr string, opts Options) (*Worker, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return Serve(ln, opts), nil
}

// Serve serves on ln until Close.
func Serve(ln net.Listener, opts Options) *Worker {
	if opts.Tokens <= 0 {
		opts.Tokens = 1
	}
	if opts.Model == "" {
		opts.Model = "mock-model"
	}
	if opts.TLS != nil {
		ln = tls.NewListener(ln, opts.TLS)
	}
	w := &Worker{opts: opts, ln: ln}
	w.realtimeFn = newRealtime(w)
	if opts.Engine.MaxNumSeqs > 0 {
		w.engine = newEngine(opts.Engine)
	}
	w.srv = &fasthttp.Server{Handler: w.handle, Name: "mockworker", NoDefaultDate: true, CloseOnShutdown: true,
		MaxRequestBodySize: MaxBodyBytes, IdleTimeout: opts.KeepAlive,
		// Headers up to the router's largest limit plus what it adds; the
		// buffer is held only while a request is read.
		ReadBufferSize: 80 << 10, ReduceMemoryUsage: true,
		Logger: quiet{}, // a killed or cut connection is the point of some tests, not news
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			switch st {
			case fasthttp.StateNew:
				w.conns.Store(c, struct{}{})
			case fasthttp.StateClosed, fasthttp.StateHijacked:
				w.conns.Delete(c)
			}
		}}
	go func() { _ = w.srv.Serve(ln) }()
	return w
}

// Kill stops the worker abruptly, as a crash would: the listener and every
// open connection are closed at once, answers in progress are cut.
func (w *Worker) Kill() {
	_ = w.ln.Close()
	w.conns.Range(func(c, _ any) bool {
		_ = c.(net.Conn).Close()
		return true
	})
	go func() { _ = w.srv.Shutdown() }() // reaps what is left
}

// Addr returns the listen address.
func (w *Worker) Addr() string { return w.ln.Addr().String() }

// URL returns the base URL: https:// with Options.TLS, unix:/path on a
// unix socket.
func (w *Worker) URL() string {
	if a, ok := w.ln.Addr().(*net.UnixAddr); ok {
		return "unix:" + a.Name
	}
	if w.opts.TLS != nil {
		return "https://" + w.Addr()
	}
	return "http://" + w.Addr()
}

// Served returns how many generation and embedding requests it answered.
func (w *Worker) Served() int64 { return w.served.Load() }

// Active returns how many requests are being answered right now.
func (w *Worker) Active() int64 { return w.active.Load() }

// Close stops listening and closes open connections. The listener is closed
// here too: a Shutdown that runs before Serve has taken the listener is a
// no-op in fasthttp, and Serve would then run on.
func (w *Worker) Close() error {
	if w.engine != nil {
		w.engine.close()
	}
	err := w.srv.Shutdown()
	_ = w.ln.Close()
	return err
}

func (w *Worker) handle(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set("x-mock-worker", strconv.FormatUint(w.opts.ID, 10))
	// The data-parallel rank, echoed: as vLLM and SGLang read it
	// (X-Data-Parallel-Rank), and as NVIDIA Dynamo names it (x-dp-rank).
	if r := ctx.Request.Header.Peek("X-Data-Parallel-Rank"); r != nil {
		ctx.Response.Header.SetBytesV("x-mock-dp-rank", r)
	}
	if r := ctx.Request.Header.Peek("x-dp-rank"); r != nil {
		ctx.Response.Header.SetBytesV("x-mock-x-dp-rank", r)
	}
	if len(ctx.Request.Header.Peek("Origin")) > 0 { // vLLM lets every origin by default (--allowed-origins)
		ctx.Response.Header.DisableNormalizing() // as uvicorn writes it
		ctx.Response.Header.Set("access-control-allow-origin", "*")
	}
	path := string(ctx.Path())
	if w.opts.APIKey != "" && strings.HasPrefix(path, "/v1/") &&
		string(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)) != "Bearer "+w.opts.APIKey {
		ctx.SetStatusCode(fasthttp.StatusUnauthorized)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":"Unauthorized"}`)
		return
	}
	switch {
	case path == "/health":
		ctx.SetBodyString("ok")
	case path == "/v1/models" && ctx.IsGet():
		w.models(ctx)
	case strings.HasPrefix(path, "/bootstrap/") && ctx.IsGet():
		w.bootstrap(ctx)
	case path == "/metrics" && ctx.IsGet() && !w.opts.NoMetrics:
		w.metrics(ctx)
	case path == "/sleep" || path == "/wake_up" || path == "/is_sleeping":
		w.sleepMode(ctx, path)
	case w.sleep.Load() != 0 && strings.HasPrefix(path, "/v1/"):
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"the engine is sleeping","type":"ServiceUnavailable","code":503}}`)
	case ctx.IsPost() && (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/embeddings"):
		w.active.Add(1)
		if !w.generate(ctx, path) {
			w.active.Add(-1)
		}
	case path == "/v1/realtime" && ctx.IsGet():
		w.realtimeFn(ctx)
	case path == "/v1/responses" && ctx.IsPost():
		w.createResponse(ctx)
	case strings.HasPrefix(path, "/v1/responses/"):
		w.storedResponse(ctx, path[len("/v1/responses/"):])
	case ctx.IsPost():
		// Any other engine route (/v1/messages, /tokenize, audio...):
		// say which worker saw which path, so routing can be checked.
		w.served.Add(1)
		ctx.SetContentType("application/json")
		ctx.SetBody(fmt.Appendf(nil, `{"object":"echo","path":%q,"worker":%d,"bytes":%d}`, path, w.opts.ID, len(ctx.PostBody())))
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"no such route","type":"not_found","code":404}}`)
	}
}

// sleepMode serves vLLM's sleep mode endpoints (its development mode's):
// POST /sleep?level=1|2 puts the engine to sleep (its weights offloaded,
// or discarded with its KV cache), POST /wake_up wakes it, GET
// /is_sleeping says which. The metrics page reports it as vLLM does
// (vllm:engine_sleep_state); while asleep the worker answers 503 under
// /v1/ (an engine without its weights cannot generate).
func (w *Worker) sleepMode(ctx *fasthttp.RequestCtx, path string) {
	ctx.SetContentType("application/json")
	switch {
	case path == "/is_sleeping" && ctx.IsGet():
		ctx.SetBody(fmt.Appendf(nil, `{"is_sleeping":%t}`, w.sleep.Load() != 0))
	case path == "/sleep" && ctx.IsPost():
		level := 1
		if q := ctx.QueryArgs().Peek("level"); q != nil {
			n, err := strconv.Atoi(string(q))
			if err != nil || n < 1 || n > 2 {
				ctx.SetStatusCode(fasthttp.StatusBadRequest)
				ctx.SetBodyString(`{"error":"level must be 1 or 2"}`)
				return
			}
			level = n
		}
		w.sleep.Store(int32(level))
	case path == "/wake_up" && ctx.IsPost():
		w.sleep.Store(0)
	default:
		ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
		ctx.SetBodyString(`{"error":"method not allowed"}`)
	}
}

// Asleep reports whether the worker is in vLLM's sleep mode (POST /sleep).
func (w *Worker) Asleep() bool { return w.sleep.Load() != 0 }

func (w *Worker) models(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	b := []byte(`{"object":"list","data":[`)
	if w.opts.MetricsDialect == "llamacpp" { // llama-server's: one model, its slot's context under meta
		ctx.SetBody(fmt.Appendf(b, `{"id":%q,"object":"model","created":1764600000,"owned_by":"llamacpp","meta":{"n_ctx":%d,"n_ctx_train":131072}}]}`,
			w.opts.Model, w.contextLen()))
		return
	}
	// vLLM's entry shape: the router passes these fields through.
	b = fmt.Appendf(b, `{"id":%q,"object":"model","created":1764600000,"owned_by":"vllm","root":%q,"parent":null,"max_model_len":%d}`,
		w.opts.Model, w.opts.Model, w.contextLen())
	for _, l := range w.opts.LoRAs {
		b = fmt.Appendf(b, `,{"id":%q,"object":"model","created":1764600000,"owned_by":"vllm","root":"/adapters/%s","parent":%q,"max_model_len":%d}`,
			l, l, w.opts.Model, w.contextLen())
	}
	ctx.SetBody(append(b, "]}"...))
}

// contextLen is the context length /v1/models reports.
func (w *Worker) contextLen() int {
	if w.opts.MaxModelLen > 0 {
		return w.opts.MaxModelLen
	}
	return DefaultMaxModelLen
}

// quiet drops fasthttp's per-connection error messages.
type quiet struct{}

func (quiet) Printf(string, ...any) {}
