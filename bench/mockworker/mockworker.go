// Package mockworker is an OpenAI-compatible fake inference server: it
// streams SSE tokens for chat/completions, answers embeddings, models and
// health, and can fail a share of requests. Tests, the demo and the
// benchmarks run it over real loopback sockets.
package mockworker

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
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
}

// Worker is a running mock worker.
type Worker struct {
	opts   Options
	ln     net.Listener
	srv    *fasthttp.Server
	served atomic.Int64
	active atomic.Int64
	parser fastjson.ParserPool
	conns  sync.Map // open net.Conn → struct{}, for Kill
}

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
	w := &Worker{opts: opts, ln: ln}
	w.srv = &fasthttp.Server{Handler: w.handle, Name: "mockworker", NoDefaultDate: true, CloseOnShutdown: true,
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

// URL returns the base URL.
func (w *Worker) URL() string { return "http://" + w.Addr() }

// Served returns how many generation and embedding requests it answered.
func (w *Worker) Served() int64 { return w.served.Load() }

// Active returns how many requests are being answered right now.
func (w *Worker) Active() int64 { return w.active.Load() }

// Close stops listening and closes open connections. The listener is closed
// here too: a Shutdown that runs before Serve has taken the listener is a
// no-op in fasthttp, and Serve would then run on.
func (w *Worker) Close() error {
	err := w.srv.Shutdown()
	_ = w.ln.Close()
	return err
}

func (w *Worker) handle(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set("x-mock-worker", strconv.FormatUint(w.opts.ID, 10))
	if r := ctx.Request.Header.Peek("x-dp-rank"); r != nil {
		ctx.Response.Header.SetBytesV("x-mock-dp-rank", r)
	}
	path := string(ctx.Path())
	switch {
	case path == "/health":
		ctx.SetBodyString("ok")
	case path == "/v1/models" && ctx.IsGet():
		w.models(ctx)
	case ctx.IsPost() && (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/embeddings"):
		w.active.Add(1)
		if !w.generate(ctx, path) {
			w.active.Add(-1)
		}
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"no such route","type":"not_found","code":404}}`)
	}
}

func (w *Worker) models(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	b := []byte(`{"object":"list","data":[`)
	b = fmt.Appendf(b, `{"id":%q,"object":"model"}`, w.opts.Model)
	for _, l := range w.opts.LoRAs {
		b = fmt.Appendf(b, `,{"id":%q,"object":"model","parent":%q}`, l, w.opts.Model)
	}
	ctx.SetBody(append(b, "]}"...))
}

// generate answers a generation or embedding request. It reports true when
// the answer streams on after it returns (the stream then ends the request).
func (w *Worker) generate(ctx *fasthttp.RequestCtx, path string) (streaming bool) {
	p := w.parser.Get()
	defer w.parser.Put(p)
	v, err := p.ParseBytes(ctx.PostBody())
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"mock: bad json","type":"invalid_request_error","code":400}}`)
		return false
	}
	if w.opts.FailRate > 0 && rand.Float64() < w.opts.FailRate {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"mock: injected failure","type":"server_error","code":500}}`)
		return false
	}
	w.served.Add(1)
	model := string(v.GetStringBytes("model"))
	if path == "/v1/embeddings" {
		w.embeddings(ctx, v, model)
		return false
	}
	if v.GetBool("stream") {
		w.stream(ctx, model)
		return true
	}
	if w.opts.TokenInterval > 0 {
		time.Sleep(time.Duration(w.opts.Tokens) * w.opts.TokenInterval)
	}
	ctx.SetContentType("application/json")
	text := make([]byte, 0, 8*w.opts.Tokens)
	for i := 0; i < w.opts.Tokens; i++ {
		text = fmt.Appendf(text, "tok%d ", i)
	}
	ctx.SetBody(fmt.Appendf(nil,
		`{"id":"cmpl-%d","object":"chat.completion","model":%q,"worker":%d,"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"completion_tokens":%d}}`,
		w.served.Load(), model, w.opts.ID, text, w.opts.Tokens))
	return false
}

func (w *Worker) stream(ctx *fasthttp.RequestCtx, model string) {
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	id, tokens, interval := w.opts.ID, w.opts.Tokens, w.opts.TokenInterval
	ctx.SetBodyStreamWriter(func(bw *bufio.Writer) {
		defer w.active.Add(-1)
		for i := 0; i < tokens; i++ {
			if interval > 0 {
				time.Sleep(interval)
			}
			fmt.Fprintf(bw, "data: {\"object\":\"chat.completion.chunk\",\"model\":%q,\"worker\":%d,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", model, id, i)
			if bw.Flush() != nil {
				return // client went away
			}
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
	b := []byte(`{"object":"list","data":[`)
	for i := 0; i < inputs; i++ {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"object":"embedding","index":%d,"embedding":[0.%d,0.5,0.25]}`, i, w.opts.ID)
	}
	b = fmt.Appendf(b, `],"model":%q,"worker":%d}`, model, w.opts.ID)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// quiet drops fasthttp's per-connection error messages.
type quiet struct{}

func (quiet) Printf(string, ...any) {}
