// Package frontend is fastroute's fasthttp front end: it parses OpenAI-style
// requests, asks the selector for a worker, proxies the request there through
// a pooled per-worker HostClient, streams the answer back chunk by chunk and
// releases the reservation exactly once however the exchange ends.
package frontend

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/http/hangup"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/dataplane/tracing"
	"github.com/fastroute/fastroute/internal/bearer"
	"github.com/fastroute/fastroute/internal/dialer"
	"github.com/puzpuzpuz/xsync/v3"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// Options configures a Server.
type Options struct {
	Selector    *dataplane.Selector
	Retries     int
	RetryBudget RetryBudget
	// ClientLimits are a client connection's bounds (SetClientLimits
	// changes them for the connections handed to fasthttp from then on).
	ClientLimits
	// NameCacheTime is how long a worker's host name's addresses are used
	// before it is looked up again (0: dataplane.NameCacheTime).
	NameCacheTime time.Duration
	// DialsPerWorker bounds the connects in flight to one worker (0:
	// DefaultDialsPerWorker); the others wait their turn (up to
	// Policy.FirstByteTimeout) instead of all racing for its accept queue.
	DialsPerWorker int
	// MaxConnections bounds the client connections open at once (0:
	// DefaultMaxConnections()): beyond, new ones wait in the listen queue
	// until one closes.
	MaxConnections int
	Logger         *slog.Logger
	// Policy is what a reload may change of how requests are treated
	// (SetPolicy).
	Policy Policy
	// AccessLog gets the access lines (nil: none, whatever Policy.Access
	// says).
	AccessLog *slog.Logger
	// QueueSize requests that find every worker they may go to busy wait,
	// each up to QueueTimeout, for one to free a slot, instead of a 429 at
	// once (0: none wait; SetQueue changes both).
	QueueSize    int
	QueueTimeout time.Duration
	// TLS, when set, has clients speak TLS (HTTP/1.1 inside); nil: plain
	// HTTP.
	TLS *tls.Config
	// WorkerTLS is the configuration of connections to https:// workers,
	// each given its host as the server name unless it names one (nil:
	// the system's roots); SetWorkerTLS replaces it.
	WorkerTLS *tls.Config
	// APIKeys, when on, are the keys clients must present (authenticate),
	// each with its caps (requests in flight, tokens and requests a
	// minute), priority and models; nil or off: none checked. The router sets them anew on a
	// reload.
	APIKeys *apikeys.Keys
	// WorkerAPIKey replaces a client's key on the requests it sends to
	// workers while APIKeys is on (nil or empty: its request goes without
	// one); a reload may change it.
	WorkerAPIKey *bearer.Token
	// ProxyProtocol, when set, has connections from a load balancer
	// begin with a PROXY protocol header naming the client's address;
	// nil: none does.
	ProxyProtocol *ProxyProtocol
	// Tracer, when set, traces the requests it samples: each gets the
	// router's span, whose id its worker sees as the traceparent's parent
	// (traceRequest); nil: traceparent headers pass untouched.
	Tracer *tracing.Tracer
}

// Server is the request front end.
type Server struct {
	opts      Options
	sel       *dataplane.Selector
	reg       *dataplane.Registry
	upstreams *xsync.MapOf[*dataplane.Worker, *upstream]
	conns     *xsync.MapOf[net.Conn, struct{}] // open client connections, each watched for its hang-up (clientConn.watch)
	upConns   *xsync.MapOf[net.Conn, struct{}] // open upstream connections
	exchanges sync.Pool
	parsers   fastjson.ParserPool
	metrics   *Metrics
	queue     *waitQueue                          // requests waiting for a busy worker (while on)
	policy    atomic.Pointer[policy]              // what a reload may change of how requests are treated (SetPolicy)
	workerTLS atomic.Pointer[tls.Config]          // Options.WorkerTLS, or what a reload replaced it with (SetWorkerTLS)
	keys      *apikeys.Keys                       // clients' API keys; nil: none
	retries   atomic.Int64                        // router.retries, reloadable
	budget    atomic.Pointer[RetryBudget]         // router.retry_budget, reloadable; nil: none
	holding   atomic.Int64                        // requests holding a worker, counted while a budget is set (holdWorker)
	retrying  atomic.Int64                        // of those, the ones on a retry (mayRetry)
	aliases   atomic.Pointer[aliases.Table]       // model aliases (SetAliases); nil: none
	mirrors   atomic.Pointer[mirrors.Table]       // model mirrors (SetMirrors); nil: none
	copies    sync.Pool                           // *mirrorCopy
	copying   *xsync.MapOf[*mirrorCopy, struct{}] // the mirrors' copies in flight, for Shutdown to cut
	serves    func(model []byte) bool             // sel.Serves, made once (a fallback alias's test of its targets)
	hangups   *hangup.Watcher[exchange]           // nil: client hang-ups are noticed only on write
	upCloses  *hangup.Watcher[trackedConn]        // workers' closes of their connections (trackedConn.watchCloses); nil: none watched
	takeovers atomic.Int64                        // client connections taken over from fasthttp (takeOver), until closed or served by it again
	tunnels   atomic.Int64                        // WebSocket sessions open (relayTunnel)
	closing   atomic.Bool                         // Shutdown began: a taken-over connection's answer is its last (keepAfter)
	withdrawn atomic.Bool                         // GET /health answers 503 (Withdraw)
	gensMu    sync.Mutex                          // SetClientLimits, Serve and Shutdown over gens
	gens      []*generation                       // the fasthttp servers with connections, or the current one (under gensMu)
	current   atomic.Pointer[generation]          // the last of gens: the one the gate's next connections go to
	gate      atomic.Pointer[gate]                // the listener's, once Serve began
	maxConns  atomic.Int64                        // limits.max_connections (SetMaxConnections)
	proxyFrom atomic.Pointer[ProxyProtocol]       // proxy_protocol (SetProxyProtocol); nil: off
	listenTLS atomic.Pointer[tls.Config]          // Options.TLS, or what SetListenerTLS set; nil: plain HTTP
	fullSaid  atomic.Int64                        // when the listener stopping at max_connections was last logged (Unix ns)
	proxySaid atomic.Int64                        // when a connection refused for its PROXY protocol header was last logged (Unix ns)
	log       *slog.Logger
	dial      func(addr string, timeout time.Duration) (net.Conn, error) // names.Dial; tests count dials
	names     *dialer.Dialer                                             // connects to workers, their names looked up every NameCacheTime, their addresses raced (Happy Eyeballs)
}

// New returns a Server; call Serve to start it.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{
		opts:      opts,
		sel:       opts.Selector,
		reg:       opts.Selector.Registry(),
		upstreams: xsync.NewMapOf[*dataplane.Worker, *upstream](),
		conns:     xsync.NewMapOf[net.Conn, struct{}](),
		upConns:   xsync.NewMapOf[net.Conn, struct{}](),
		copying:   xsync.NewMapOf[*mirrorCopy, struct{}](),
		metrics:   newMetrics(),
		queue:     newWaitQueue(opts.QueueSize, opts.QueueTimeout),
		log:       opts.Logger,
		names:     &dialer.Dialer{CacheTime: cmp.Or(opts.NameCacheTime, dataplane.NameCacheTime)},
		keys:      opts.APIKeys,
	}
	s.dial = s.names.Dial
	s.SetMaxConnections(opts.MaxConnections)
	s.proxyFrom.Store(opts.ProxyProtocol)
	s.listenTLS.Store(opts.TLS)
	s.exchanges.New = func() any {
		ex := &exchange{s: s}
		ex.beginStreamFn, ex.runTakenFn, ex.runTunnelFn = ex.beginStream, ex.runTaken, ex.runTunnel
		ex.relay.stepFn = ex.relay.step
		return ex
	}
	s.metrics.openConnections, s.metrics.maxConnections = s.OpenConnections, &s.maxConns
	s.metrics.statsOf = s.statsOf
	s.metrics.queue = s.queue
	s.metrics.keys = s.keys
	s.metrics.aliases = &s.aliases
	s.metrics.mirrors = &s.mirrors
	s.metrics.retrying = &s.retrying
	s.metrics.tunnels = &s.tunnels
	s.copies.New = func() any { return new(mirrorCopy) }
	s.serves = s.sel.Serves
	s.reg.Subscribe(s.workerChanged)
	if w, err := hangup.New(clientHungUp); err != nil {
		s.log.Warn("client hang-ups are noticed only when the router writes to them", "err", err)
	} else {
		s.hangups = w
	}
	if w, err := hangup.New(workerClosed); err == nil {
		s.upCloses = w
	}
	s.SetPolicy(opts.Policy)
	s.workerTLS.Store(opts.WorkerTLS)
	s.retries.Store(int64(opts.Retries))
	s.SetRetryBudget(opts.RetryBudget)
	first := s.newGeneration(opts.ClientLimits)
	s.gens = []*generation{first}
	s.current.Store(first)
	return s
}

// reportAnswer feeds the passive health check: ok is an answer below 500.
func (s *Server) reportAnswer(w *dataplane.Worker, ok bool) {
	if d := s.reg.ReportAnswer(w, ok); d > 0 {
		s.log.Warn("worker ejected after consecutive failures", "worker", w.ID(), "for", d)
	}
}

// SetRetries changes how many times a request may move to another worker,
// for the requests dispatched from now on.
func (s *Server) SetRetries(n int) { s.retries.Store(int64(n)) }

// Metrics returns the front end's counters.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Serve answers requests on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.gensMu.Lock() // SetClientLimits sets the gate's waits once it is stored
	l := s.current.Load().limits
	g := newGate(ln, l.ReadTimeout, l.idle(), gateOptions{max: &s.maxConns, drop: s.closeConn,
		short: s.acceptShort, full: s.connectionsFull, tls: &s.listenTLS, proxy: &s.proxyFrom, refused: s.proxyRefused})
	s.gate.Store(g)
	s.gensMu.Unlock()
	return s.serveGenerations(g)
}

// DefaultMaxConnections is the most client connections a front end keeps
// open when Options.MaxConnections is 0: half the process's open-files
// limit (a connection whose request is on a worker holds a second
// descriptor, to the worker) less 128 for its other files (listeners,
// engine scrapes, logs), and at least 64. Go raises the limit to the hard
// one at start.
func DefaultMaxConnections() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > math.MaxInt32 {
		return math.MaxInt32
	}
	return max(64, (int(lim.Cur)-256)/2)
}

// connectionsFull counts the listener stopped at limits.max_connections,
// and logs it at most once a minute.
func (s *Server) connectionsFull() {
	s.metrics.connectionsFull.Inc()
	if aMinuteSince(&s.fullSaid) {
		s.log.Warn("limits.max_connections client connections are open: new ones wait in the listen queue until one closes",
			"max_connections", s.maxConns.Load())
	}
}

// aMinuteSince says whether a minute passed since the time in last (Unix
// nanoseconds; 0: never), and if so sets it to now, once among callers at
// the same time: for a log line at most once a minute.
func aMinuteSince(last *atomic.Int64) bool {
	now := time.Now().UnixNano()
	was := last.Load()
	return now-was >= int64(time.Minute) && last.CompareAndSwap(was, now)
}

// MaxConnections returns the most client connections open at once.
func (s *Server) MaxConnections() int { return int(s.maxConns.Load()) }

// SetMaxConnections bounds the client connections open at once (0:
// DefaultMaxConnections()), from the next accept: a larger bound accepts
// again at once, a smaller one closes none of those open and accepts no
// more until fewer are open.
func (s *Server) SetMaxConnections(n int) {
	if n <= 0 {
		n = DefaultMaxConnections()
	}
	s.maxConns.Store(int64(n))
	if g := s.gate.Load(); g != nil {
		g.madeRoom()
	}
}

// SetListenerTLS has the connections accepted from now on speak TLS with
// conf (nil: plain HTTP); those open keep what they were accepted with.
func (s *Server) SetListenerTLS(conf *tls.Config) { s.listenTLS.Store(conf) }

// SetProxyProtocol has the connections accepted from now on read a PROXY
// protocol header as p says (nil: none does); those open keep what they
// were accepted with.
func (s *Server) SetProxyProtocol(p *ProxyProtocol) { s.proxyFrom.Store(p) }

// OpenConnections returns how many client connections are open (accepted,
// not yet closed).
func (s *Server) OpenConnections() int64 {
	if g := s.gate.Load(); g != nil {
		return g.open.Load()
	}
	return 0
}

// acceptShort counts an accept that failed for want of resources and logs
// the first of a run of them (the gate's pause is then the first one), with
// what to raise for the commonest: the open-files limit.
func (s *Server) acceptShort(err error, pause time.Duration) {
	s.metrics.acceptShortages.Inc()
	if pause == firstAcceptPause {
		s.log.Warn("cannot accept connections, accepting again shortly; if the open-files limit is reached, raise it (ulimit -n, systemd LimitNOFILE)",
			"err", err, "open_connections", s.OpenConnections())
	}
}

// proxyRefused counts a connection closed unserved for the PROXY protocol
// header it did not send, or sent malformed, and logs it at most once a
// minute: a balancer that sends none, or a client that reaches the router
// past it, is a setup to fix.
func (s *Server) proxyRefused(err error, peer net.Addr) {
	s.metrics.proxyRefusals.Inc()
	if aMinuteSince(&s.proxySaid) {
		s.log.Warn("connection closed unserved: it must begin with a PROXY protocol header (proxy_protocol)", "peer", peer.String(), "err", err)
	}
}

// Withdraw has GET /health answer 503 from now on, while every other
// request is served as before: a load balancer that probes it takes the
// router out of rotation before it drains (shutdown_delay).
func (s *Server) Withdraw() { s.withdrawn.Store(true) }

// drainLinger is how long a drain (Shutdown) leaves a connection that
// waits in the gate for a request: one accepted before the listener
// closed, whose request is on its way, or one kept alive between two
// requests, whose client may be sending its next. A request that comes
// meanwhile is served, its answer the connection's last (Connection:
// close); closed at once, the connection would fail a request the client
// had sent already. Under an upgrade the new process serves the
// connection the client opens next.
const drainLinger = 250 * time.Millisecond

// Shutdown stops accepting, leaves the connections waiting for a request
// up to drainLinger for it, waits for open requests until ctx ends, then
// cuts the connections still open (their streams end, their reservations
// are released), and closes the idle upstream connections. Answers sent
// meanwhile close their connections.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	if g := s.gate.Load(); g != nil {
		g.stopAccepting()
		s.settle(ctx, g)
	}
	err := s.shutdownGenerations(ctx)
	if err == nil {
		err = s.awaitTakeovers(ctx)
	}
	if ctx.Err() != nil {
		n := 0
		s.conns.Range(func(c net.Conn, _ struct{}) bool {
			_ = c.Close()
			n++
			return true
		})
		// And their upstream side, so none waits on a worker's next byte.
		s.upConns.Range(func(c net.Conn, _ struct{}) bool {
			_ = c.Close()
			return true
		})
		s.log.Warn("shutdown timeout: cut the requests still open", "connections", n)
		// Cut connections end their handlers at once; wait for that.
		wait, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = s.shutdownGenerations(wait)
		if err == nil {
			err = s.awaitTakeovers(wait)
		}
		cancel()
	}
	s.cutCopies()
	s.upstreams.Range(func(_ *dataplane.Worker, u *upstream) bool {
		u.hc.CloseIdleConnections()
		return true
	})
	if s.hangups != nil {
		err = errors.Join(err, s.hangups.Close())
	}
	if s.upCloses != nil {
		err = errors.Join(err, s.upCloses.Close())
	}
	return err
}

// settle waits, before fasthttp's shutdown closes the gate and the
// connections idle in fasthttp, until no connection is taken over, none
// waits in the gate but those that waited drainLinger (closed then) and,
// for drainLinger at most, none is in fasthttp; or until ctx ends. A
// stream that began as kept-alive is so given back to the gate when it
// ends, and a kept-alive connection that waits for its next request has
// drainLinger to send it, answered as the connection's last.
func (s *Server) settle(ctx context.Context, g *gate) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	lingerEnd := time.Now().Add(drainLinger)
	for !g.closeLingering() || s.takeovers.Load() != 0 ||
		(s.serving() > 0 && time.Now().Before(lingerEnd)) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// trackConn keeps the set of open client connections, so a shutdown that
// runs out of time can cut them, and watches each for its client's
// hang-up.
func (s *Server) trackConn(c net.Conn, st fasthttp.ConnState) {
	switch st {
	case fasthttp.StateNew:
		if _, ok := s.conns.Load(c); ok {
			return // given back by a take-over (continueConn): tracked and watched still
		}
		if cc, ok := c.(*clientConn); ok && s.hangups != nil {
			if fd, err := hangup.Descriptor(c); err == nil {
				cc.watch, _ = s.hangups.Add(fd)
			}
		}
		s.conns.Store(c, struct{}{})
	case fasthttp.StateClosed:
		if _, ok := s.conns.LoadAndDelete(c); ok && s.hangups != nil {
			if cc, ok := c.(*clientConn); ok {
				s.hangups.Remove(cc.watch)
			}
		}
	case fasthttp.StateHijacked:
		// The exchange took the connection over (takeOver): it stays
		// tracked, and is served again once both are done with it.
		if cc, ok := c.(*clientConn); ok && cc.handedOff() {
			s.continueConn(cc)
		}
	}
}

// workerChanged drops the pooled client of a worker object that left the
// registry or was replaced by a new spec.
func (s *Server) workerChanged(w *dataplane.Worker, c dataplane.Change) {
	if c == dataplane.Removed || c == dataplane.Replaced {
		s.forget(w)
	}
}

// forget drops the pooled client of a worker.
func (s *Server) forget(w *dataplane.Worker) {
	if u, ok := s.upstreams.LoadAndDelete(w); ok {
		u.hc.CloseIdleConnections()
	}
}

// serve is fasthttp's handler: Handle, with an answer that keeps its
// connection held (sockIO.hold) for the wait for the connection's next
// request, which sends it; on a connection of a generation that retired,
// sent from a take-over that moves the connection on (moveOn). One held
// before (its connection's next request came with it, pipelined) leaves
// first.
func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	cc, _ := ctx.Conn().(*clientConn)
	if cc != nil {
		_ = cc.flushHeld() // a failed write fails this answer's too
		cc.requests++
	}
	s.Handle(ctx)
	if ctx.Hijacked() {
		return // the answer is sent from the take-over (runTaken, beginStream)
	}
	if cc != nil && cc.gen != nil && cc.gen != s.current.Load() && s.keepsAlive(ctx) {
		s.moveOn(ctx) // a reload set other client limits: the next request is read under them
		return
	}
	s.markCORS(ctx)
	if s.closing.Load() || (cc != nil && cc.spent(s.policy.Load().MaxRequestsPerConnection)) {
		closeAfter(&ctx.Response.Header)
	}
	if cc != nil && s.keepsAlive(ctx) {
		cc.hold()
	}
}

// Handle routes one request. While clients' API keys are on, every
// request but a CORS preflight and GET /health must present one.
func (s *Server) Handle(ctx *fasthttp.RequestCtx) {
	if c := s.policy.Load().cors; c != nil && c.preflight(ctx) {
		return
	}
	path := ctx.Path()
	var client *apikeys.Client
	if s.keys != nil && s.keys.On() && string(path) != "/health" {
		if client = s.authenticate(ctx); client == nil {
			return
		}
	}
	switch string(path) {
	case "/v1/chat/completions":
		s.proxy(ctx, routeChat, client)
	case "/v1/completions":
		s.proxy(ctx, routeCompletions, client)
	case "/v1/embeddings":
		s.proxy(ctx, routeEmbeddings, client)
	case "/v1/models":
		if !ctx.IsGet() && !ctx.IsHead() { // HEAD as an engine's GET routes take it (Starlette's)
			methodNotAllowed(ctx, "GET, HEAD")
			return
		}
		s.models(ctx, client)
	case "/v1/responses":
		s.proxy(ctx, routeResponses, client)
	case "/v1/messages":
		s.proxy(ctx, routeMessages, client)
	case "/health":
		s.health(ctx)
	default:
		s.other(ctx, client)
	}
}

// engineRoutes are the engines' own endpoints outside /v1/ (vLLM's and
// SGLang's: vLLM's Cohere-style /v2/rerank, /v2/embed and /cohere/v2/chat,
// SGLang's native /generate and /encode among them), proxied like the
// OpenAI ones.
var engineRoutes = []string{"/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank", "/v2/embed",
	"/cohere/v2/chat", "/generate", "/encode"}

var v1Prefix, modelsPrefix, responsesPrefix = []byte("/v1/"), []byte("/v1/models/"), []byte("/v1/responses/")

// workerStatePaths are the engines' endpoints under /v1/ that change a
// worker rather than answer a request: vLLM's runtime loading of LoRA
// adapters, which its documentation calls risky in production. They are
// not proxied unless the routes key names them: a client would load an
// adapter on the one worker the router happened to pick, from a path of
// its choosing.
var workerStatePaths = map[string]struct{}{"/v1/load_lora_adapter": {}, "/v1/unload_lora_adapter": {}}

// other answers every path beyond the named ones: a POST under /v1/ (but
// for workerStatePaths, refused), to an engine route or to a path of the
// routes key is proxied, as is a request about a stored response
// (storedResponse) and a WebSocket session's opening request to any of
// those paths (runTunnel); GET /v1/models/{id} is answered from the union of the
// workers' models; anything else is a 404 naming the path. client holds
// the request's API key (nil: none).
func (s *Server) other(ctx *fasthttp.RequestCtx, client *apikeys.Client) {
	path := ctx.Path()
	_, extra := s.policy.Load().routes[string(path)]
	_, changesWorker := workerStatePaths[string(path)]
	switch {
	case changesWorker && !extra:
		writeError(ctx, fasthttp.StatusForbidden, "permission_error", strconv.Quote(string(path))+
			" changes one worker and is not proxied: load adapters on each worker and declare them with the admin listener's"+
			" PUT /workers/{id}/loras, or name the path in the routes key to proxy it")
	case !extra && bytes.HasPrefix(path, responsesPrefix):
		s.storedResponse(ctx, path[len(responsesPrefix):], client)
	case (ctx.IsPost() || isWebSocket(&ctx.Request.Header)) && (extra || bytes.HasPrefix(path, v1Prefix)):
		s.proxy(ctx, routeOther, client)
	case (ctx.IsGet() || ctx.IsHead()) && bytes.HasPrefix(path, modelsPrefix):
		s.model(ctx, string(path[len(modelsPrefix):]), client)
	case extra:
		methodNotAllowed(ctx, "POST")
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no route "+strconv.Quote(string(path)))
	}
}

// storedResponse proxies a request about a stored response of the
// Responses API, whose path is /v1/responses/{id}[/...]: vLLM's GET
// /v1/responses/{id} (retrieve, or resume its stream) and POST
// /v1/responses/{id}/cancel, OpenAI's DELETE and input_items. It goes to the
// worker that holds the response, the only one that can answer it
// (dataplane.Request.Response); rest is the path after /v1/responses/.
func (s *Server) storedResponse(ctx *fasthttp.RequestCtx, rest []byte, client *apikeys.Client) {
	id, _, _ := bytes.Cut(rest, []byte("/"))
	switch {
	case len(id) == 0:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no route "+strconv.Quote(string(ctx.Path())))
	case !ctx.IsGet() && !ctx.IsPost() && !ctx.IsDelete():
		methodNotAllowed(ctx, "GET, POST, DELETE")
	default:
		s.forward(ctx, routeResponses, id, client)
	}
}

// readError answers requests fasthttp could not read (oversize body, bad
// framing) on a connection bounded by l. But for a timeout, the client may
// still be sending the rest: the connection's close lingers
// (clientConn.lingerOnClose).
func (s *Server) readError(ctx *fasthttp.RequestCtx, err error, l ClientLimits) {
	defer s.markCORS(ctx) // a browser reads the error only with them (the head was read unless it was too large or malformed)
	timedOut := isTimeout(err)
	if cc, ok := ctx.Conn().(*clientConn); ok && !timedOut {
		cc.lingerOnClose()
	}
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error",
			"request body exceeds limits.max_body_bytes ("+strconv.Itoa(l.MaxBodyBytes)+" bytes)")
		return
	}
	var small *fasthttp.ErrSmallBuffer
	if errors.As(err, &small) {
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error",
			"request line and headers exceed limits.max_header_bytes ("+strconv.Itoa(l.MaxHeaderBytes)+" bytes)")
		return
	}
	if timedOut {
		writeError(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", "request read timed out")
		return
	}
	// The parser's message may quote the request (headers, credentials
	// included): it is never echoed.
	writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "malformed HTTP request")
}

// proxy forwards a POST to the route rt to the worker selection picks
// (forward), and opens a WebSocket session there too (OpenAI's Responses
// API has a WebSocket mode).
func (s *Server) proxy(ctx *fasthttp.RequestCtx, rt route, client *apikeys.Client) {
	switch {
	case ctx.IsPost():
		s.forward(ctx, rt, nil, client)
	case isWebSocket(&ctx.Request.Header):
		s.forward(ctx, routeWebSocket, nil, client)
	default:
		methodNotAllowed(ctx, "POST")
	}
}

// forward forwards a request to the route rt, about the stored response
// response names (nil: none), to the worker selection picks, within a
// slot of the client whose API key it presented (nil: none).
func (s *Server) forward(ctx *fasthttp.RequestCtx, rt route, response []byte, client *apikeys.Client) {
	start := time.Now()
	ex := s.exchanges.Get().(*exchange)
	ex.begin(ctx, rt, start)
	if !ex.admit(ctx, client) {
		ex.end(outcomeKeyLimited, fasthttp.StatusTooManyRequests)
		return
	}
	// A stored response's retrieval (or the replay of its stream) shows
	// the usage its creation was charged: not charged again.
	ex.metered = client != nil && response == nil && rt != routeWebSocket // a session's answers are not read
	ex.req.Response = append(ex.req.Response, response...)
	ex.creates = rt == routeResponses && response == nil
	ex.generate = rt == routeOther && string(ctx.Path()) == "/generate"
	query, err := ex.parse(ctx)
	if rt == routeWebSocket && len(ex.req.Model) == 0 { // OpenAI's realtime URL names it
		ex.req.Model = append(ex.req.Model, ctx.QueryArgs().Peek("model")...)
	}
	if err != nil {
		status := fasthttp.StatusBadRequest
		if errors.Is(err, errCodedBody) {
			status = fasthttp.StatusUnsupportedMediaType
			ctx.Response.Header.Set(fasthttp.HeaderAcceptEncoding, "identity")
		}
		writeError(ctx, status, "invalid_request_error", err.Error())
		ex.end(outcomeInvalid, status)
		return
	}
	if !ex.modelAllowed(ctx, response != nil) {
		ex.end(outcomeInvalid, fasthttp.StatusForbidden)
		return
	}
	if !ex.applyAlias(ctx) {
		ex.end(outcomeInvalid, fasthttp.StatusBadRequest)
		return
	}
	ex.model = s.metrics.models.Of(ex.req.Model) // "": none named
	t := time.Now()
	err = ex.pick()
	s.metrics.routeTime.Observe(time.Since(t))
	if err != nil && !query && s.queue.on() && errors.Is(err, dataplane.ErrResourceExhausted) {
		ex.watchClient(ctx) // a client that leaves the queue is gone at once
		err = ex.awaitSlot(err)
		if err != nil {
			ex.unwatch()
		}
	}
	if err == errHungUpQueued {
		ctx.SetConnectionClose()
		ctx.SetStatusCode(statusClientClosed)
		ex.end(outcomeCancelled, statusClientClosed)
		return
	}
	if err != nil {
		writeSelectError(ctx, err)
		ex.end(selectOutcome(err), ctx.Response.StatusCode())
		return
	}
	ex.picked = true
	if ex.traced {
		ex.trace.Picked = time.Since(start)
	}
	if t := s.mirrors.Load(); t != nil && !query && rt != routeWebSocket {
		ex.mirror(ctx, t)
	}
	if query && ex.split {
		ex.res.Release()
		s.queue.ended()
		ex.queryDisagg(ctx)
		ex.end(outcomeQuery, fasthttp.StatusOK)
		return
	}
	if query {
		ex.res.Release()
		s.queue.ended()
		ctx.SetContentType("application/json")
		b := append(ctx.Response.Body()[:0], `{"worker_id":`...)
		b = strconv.AppendUint(b, ex.res.Worker().ID(), 10)
		b = append(b, `,"dp_rank":`...)
		b = strconv.AppendInt(b, int64(ex.res.Rank()), 10)
		ctx.Response.SetBodyRaw(append(b, '}'))
		ex.end(outcomeQuery, fasthttp.StatusOK)
		return
	}
	ex.holdWorker()
	if ex.client.Gen() == 0 { // not watched while it waited in the queue
		ex.watchClient(ctx)
	}
	switch {
	case rt == routeWebSocket:
		ex.takeOver(ctx, ex.runTunnelFn)
		return
	case ex.stream:
		// A stream request is sent, waits on its worker and streams in a
		// goroutine of its own (takeOver).
		ex.takeOver(ctx, ex.runTakenFn)
		return
	}
	ex.run(ctx)
}

func selectOutcome(err error) outcome {
	var e *dataplane.Error
	if errors.As(err, &e) {
		switch e.Code {
		case dataplane.NoEndpoints:
			return outcomeNoEndpoints
		case dataplane.ResourceExhausted:
			return outcomeExhausted
		}
	}
	return outcomeInvalid
}

// model is an entry of /v1/models for an id no worker described itself
// (an adapter named only in the config or the admin API).
type model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	OwnedBy string `json:"owned_by"`
}

// models answers GET /v1/models: the workers' models and adapters, those
// the request's API key may use (nil: any).
func (s *Server) models(ctx *fasthttp.RequestCtx, client *apikeys.Client) {
	entries := s.modelEntries()
	out := struct {
		Object string            `json:"object"`
		Data   []json.RawMessage `json:"data"`
	}{Object: "list", Data: make([]json.RawMessage, 0, len(entries))}
	for _, e := range entries {
		if client == nil || client.Allows([]byte(e.id)) {
			out.Data = append(out.Data, e.raw)
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// model answers GET /v1/models/{id}: a 404 for a model no worker serves,
// or that the request's API key may not use (nil: any).
func (s *Server) model(ctx *fasthttp.RequestCtx, id string, client *apikeys.Client) {
	entries := s.modelEntries()
	i, ok := slices.BinarySearchFunc(entries, id, func(e modelEntry, id string) int { return strings.Compare(e.id, id) })
	if !ok || (client != nil && !client.Allows([]byte(id))) {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "model "+strconv.Quote(id)+" is not served by any worker")
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.SetBody(entries[i].raw)
}

// modelEntry is one id of the union and the entry shown for it.
type modelEntry struct {
	id  string
	raw json.RawMessage
}

// modelEntries is the union of the workers' models and adapters and the
// model aliases, sorted by id: each as the worker that lists the longest
// context for it (the first by id among equals) wrote it, with all its
// fields, since a request longer than a shorter one's moves on to it
// (Selector.LongerContext); ids only the config or the admin API name,
// aliases among them, get a minimal entry.
func (s *Server) modelEntries() []modelEntry {
	type listed struct {
		raw     json.RawMessage
		context int
	}
	seen := map[string]listed{}
	add := func(id string, raw json.RawMessage, context int) {
		if had, ok := seen[id]; !ok || (had.raw == nil && raw != nil) || (raw != nil && context > had.context) {
			seen[id] = listed{raw, context}
		}
	}
	for _, w := range s.reg.All() {
		adv := w.Advertised()
		for _, id := range slices.Concat(adv.Models, adv.Adapters) {
			add(id, adv.Entries[id], adv.Contexts[id])
		}
		for _, id := range slices.Concat(w.Spec().Models, w.Spec().LoRAs) {
			add(id, nil, 0)
		}
	}
	for _, g := range s.reg.Snapshot().Groups() { // adapters set through the admin API
		add(g.Name(), nil, 0)
	}
	for _, name := range s.aliases.Load().Names() { // a name clients may ask for
		add(name, nil, 0)
	}
	out := make([]modelEntry, 0, len(seen))
	for id, l := range seen {
		raw := l.raw
		if raw == nil {
			raw, _ = json.Marshal(model{ID: id, Object: "model", OwnedBy: "fastroute"})
		}
		out = append(out, modelEntry{id: id, raw: raw})
	}
	slices.SortFunc(out, func(a, b modelEntry) int { return strings.Compare(a.id, b.id) })
	return out
}

func (s *Server) health(ctx *fasthttp.RequestCtx) {
	n := s.reg.Snapshot().Len()
	status := fasthttp.StatusOK
	state := "ok"
	switch {
	case s.withdrawn.Load():
		status, state = fasthttp.StatusServiceUnavailable, "shutting down"
	case n == 0:
		status, state = fasthttp.StatusServiceUnavailable, "no routable workers"
	}
	writeJSON(ctx, status, map[string]any{"status": state, "routable_workers": n})
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method "+string(ctx.Method())+" not allowed; use "+allow)
}

// errorBody is the OpenAI error shape.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

func writeError(ctx *fasthttp.RequestCtx, status int, typ, msg string) {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = msg, typ, status
	writeJSON(ctx, status, b)
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		body = []byte(`{"error":{"message":"internal encoding error","type":"server_error","code":500}}`)
		status = fasthttp.StatusInternalServerError
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

func writeSelectError(ctx *fasthttp.RequestCtx, err error) {
	var e *dataplane.Error
	if !errors.As(err, &e) {
		writeError(ctx, fasthttp.StatusInternalServerError, "server_error", err.Error())
		return
	}
	switch e.Code {
	case dataplane.NoEndpoints:
		writeError(ctx, fasthttp.StatusServiceUnavailable, "no_endpoints", e.Msg)
	case dataplane.ResourceExhausted:
		ctx.Response.Header.Set("Retry-After", "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "resource_exhausted", e.Msg)
	case dataplane.NotFound:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", e.Msg)
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", e.Msg)
	}
}

// debugLogger sends fasthttp's per-connection messages (a client that
// sent garbage or went away) to slog at debug level: the client got its 4xx
// and the metrics count it, so they are not worth a line each by default.
type debugLogger struct{ log *slog.Logger }

func (l debugLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug(fmt.Sprintf(format, args...), "component", "fasthttp")
	}
}
