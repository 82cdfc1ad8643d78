package frontend

import (
	"cmp"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/aliases"
	"github.com/fastroute/fastroute/dataplane/apikeys"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/fastroute/fastroute/dataplane/mirrors"
	"github.com/fastroute/fastroute/telemetry/engine"
)

// route enumerates the proxied endpoints, for metric labels.
type route uint8

const (
	routeChat route = iota
	routeCompletions
	routeEmbeddings
	routeResponses
	routeMessages
	routeWebSocket // a WebSocket session's opening request, to any path other proxies (runTunnel)
	routeOther     // every other proxied path: more of /v1/, the engines' own, the routes key
	numRoutes
)

var routeNames = [numRoutes]string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages", "websocket", "other"}

// strict reports a route whose body must be a JSON object (the OpenAI
// generation and embedding APIs); the others are forwarded whatever they
// carry (multipart audio, say), routed by their model when a JSON body
// names one.
func (r route) strict() bool { return r <= routeEmbeddings }

// outcome enumerates how a request ended.
type outcome uint8

const (
	outcomeOK            outcome = iota // the worker answered and the answer reached the client
	outcomeQuery                        // x-query-instance-id: answered without dispatch
	outcomeInvalid                      // rejected for a bad request (4xx)
	outcomeNoEndpoints                  // no routable worker (503)
	outcomeExhausted                    // every candidate busy (429)
	outcomeUpstreamError                // transport failure or broken stream
	outcomeTimeout                      // upstream did not answer in time
	outcomeCancelled                    // client went away mid-answer
	outcomeKeyLimited                   // its API key was at its max_inflight, tokens_per_minute or requests_per_minute (429)
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "query", "invalid", "no_endpoints", "resource_exhausted", "upstream_error", "timeout", "cancelled", "api_key_limited"}

// Metrics are the front end's counters and histograms.
type Metrics struct {
	requests [numRoutes][numOutcomes]metrics.Counter
	retries  metrics.Counter
	// Retries the retry budget refused (mayRetry), and the requests on a
	// retry now (Server.retrying).
	retriesRefused metrics.Counter
	retrying       *atomic.Int64
	tunnels        *atomic.Int64 // WebSocket sessions open (Server.tunnels)
	// Workers a request for a stored response moved past because they
	// answered 404 (movesOn).
	searchMoves metrics.Counter
	// contextMoves counts requests moved on from a worker that refused
	// them as longer than its context.
	contextMoves metrics.Counter
	// Client connections the listener could not accept for want of
	// resources (file descriptors, kernel memory), each accepted later.
	acceptShortages metrics.Counter
	proxyRefusals   metrics.Counter
	// Times the listener stopped accepting with limits.max_connections
	// client connections open.
	connectionsFull metrics.Counter
	// The client connections open and the most (Server.OpenConnections,
	// limits.max_connections as it runs: SetMaxConnections), for the
	// scrape.
	openConnections func() int64
	maxConnections  *atomic.Int64
	// The wait queue: requests in it now, those refused for a full queue,
	// those displaced from it by a request of lower priority, those that
	// waited out its timeout, and the wait of those that got a worker.
	queue          *waitQueue
	queueFull      metrics.Counter
	queueDisplaced metrics.Counter
	queueTimeouts  metrics.Counter
	queueWait      *metrics.Histogram
	// Disaggregation: outcomes by leg, prefill legs' time, split requests
	// run whole by why (indexed by dataplane.Split; SplitLegs unused).
	phases          [numPhases][numOutcomes]metrics.Counter
	prefillTime     *metrics.Histogram
	disaggFallbacks [numSplits]metrics.Counter
	routeTime       *metrics.Histogram
	firstByte       *metrics.Histogram
	total           *metrics.Histogram
	statsOf         func(*dataplane.Worker) *workerStats // Server.statsOf
	keys            *apikeys.Keys                        // the clients' API keys; nil: none
	aliases         *atomic.Pointer[aliases.Table]       // the model aliases (Server.SetAliases)
	mirrors         *atomic.Pointer[mirrors.Table]       // the model mirrors (Server.SetMirrors)

	// By the model requests were routed as (modelStats).
	models *metrics.Family[modelStats]
}

// modelStats are the metrics of the requests routed as one model (an
// alias's target): their outcomes and times, and for streams of generated
// tokens the time to their first token and their time per output token.
type modelStats struct {
	requests   [numOutcomes]metrics.Counter
	seconds    *metrics.Histogram
	firstToken *metrics.Histogram
	tokenPace  *metrics.Histogram
}

func newModelStats() *modelStats {
	st := &modelStats{
		seconds:    metrics.NewHistogram(metrics.DefaultBuckets),
		firstToken: metrics.NewHistogram(firstTokenBuckets),
		tokenPace:  metrics.NewHistogram(tokenPaceBuckets),
	}
	for o := range st.requests {
		st.requests[o] = metrics.NewCounter()
	}
	return st
}

// The buckets of the time to first token and the time per output token,
// in seconds: vLLM's (vllm:time_to_first_token_seconds,
// vllm:request_time_per_output_token_seconds), the second's with three
// below 10 ms for fast decoders.
var (
	firstTokenBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5,
		7.5, 10, 20, 40, 80, 160, 640, 2560}
	tokenPaceBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
		0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
)

// maxModels is how many models' requests are counted and timed apart;
// those of further models share the label model="_other"
// (metrics.Overflow).
const maxModels = 64

func newMetrics() *Metrics {
	m := &Metrics{
		retries:         metrics.NewCounter(),
		retriesRefused:  metrics.NewCounter(),
		searchMoves:     metrics.NewCounter(),
		contextMoves:    metrics.NewCounter(),
		acceptShortages: metrics.NewCounter(),
		proxyRefusals:   metrics.NewCounter(),
		connectionsFull: metrics.NewCounter(),
		queueFull:       metrics.NewCounter(),
		queueDisplaced:  metrics.NewCounter(),
		queueTimeouts:   metrics.NewCounter(),
		queueWait:       metrics.NewHistogram(metrics.DefaultBuckets),
		routeTime:       metrics.NewHistogram([]float64{1e-7, 2.5e-7, 5e-7, 1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 1e-4, 1e-3}),
		firstByte:       metrics.NewHistogram(metrics.DefaultBuckets),
		prefillTime:     metrics.NewHistogram(metrics.DefaultBuckets),
		total:           metrics.NewHistogram(metrics.DefaultBuckets),
		models:          metrics.NewFamily(maxModels, newModelStats),
	}
	for r := range m.requests {
		for o := range m.requests[r] {
			m.requests[r][o] = metrics.NewCounter()
		}
	}
	for p := range m.phases {
		for o := range m.phases[p] {
			m.phases[p][o] = metrics.NewCounter()
		}
	}
	for i := range m.disaggFallbacks {
		m.disaggFallbacks[i] = metrics.NewCounter()
	}
	return m
}

// Requests returns the count for one route and outcome name (for tests and the demo).
func (m *Metrics) Requests(routePath, outcomeName string) uint64 {
	r, o := slices.Index(routeNames[:], routePath), slices.Index(outcomeNames[:], outcomeName)
	if r < 0 || o < 0 {
		return 0
	}
	return m.requests[r][o].Value()
}

// Phase returns the count of one leg (aggregated, prefill, decode) and outcome.
func (m *Metrics) Phase(phaseName, outcomeName string) uint64 {
	p, o := slices.Index(phaseNames[:], phaseName), slices.Index(outcomeNames[:], outcomeName)
	if p < 0 || o < 0 {
		return 0
	}
	return m.phases[p][o].Value()
}

// DisaggFallbacks returns how many split requests ran whole for the reason
// a label of fastroute_disagg_fallbacks_total names (splitReasons).
func (m *Metrics) DisaggFallbacks(reason string) uint64 {
	i := slices.Index(splitReasons[:], reason)
	if i <= 0 {
		return 0
	}
	return m.disaggFallbacks[i].Value()
}

// Retries returns how many times a request moved to another worker.
func (m *Metrics) Retries() uint64 { return m.retries.Value() }

// SearchMoves returns how many times a request for a stored response
// moved past a worker that answered 404.
func (m *Metrics) SearchMoves() uint64 { return m.searchMoves.Value() }

// moved counts a request moved on an answer, as why says.
func (m *Metrics) moved(why moveKind) {
	switch why {
	case moveSearch:
		m.searchMoves.Inc()
	case moveContext:
		m.contextMoves.Inc()
	default:
		m.retries.Inc()
	}
}

// writeModels writes the families by model.
func (m *Metrics) writeModels(w *metrics.Writer) {
	w.Header("fastroute_model_requests_total", "counter", "Requests by the model they were routed as (an alias's target) and outcome, from the moment the model was known (a body the router could not read has none).")
	m.models.Each(func(model string, st *modelStats) {
		for o := range numOutcomes {
			if n := st.requests[o].Value(); n > 0 {
				w.Sample("fastroute_model_requests_total", float64(n), "model", model, "outcome", outcomeNames[o])
			}
		}
	})
	w.Header("fastroute_model_request_seconds", "histogram", "Time from request arrival to the end of the answer, by the model requests were routed as.")
	m.models.Each(func(model string, st *modelStats) {
		w.Histogram("fastroute_model_request_seconds", st.seconds, "model", model)
	})
	w.Header("fastroute_time_to_first_token_seconds", "histogram", "Streams of generated tokens (chat, completions, /generate) by the request's model: time from the request's arrival to its first event leaving to the client (the router's queue and routing, retries, a prefill leg, the engine's time to first token).")
	m.models.Each(func(model string, st *modelStats) {
		if st.firstToken.Count() > 0 {
			w.Histogram("fastroute_time_to_first_token_seconds", st.firstToken, "model", model)
		}
	})
	w.Header("fastroute_time_per_output_token_seconds", "histogram", "Streams of generated tokens that ended well, by the request's model: time from the first event to the end over the tokens after the first (the completion tokens the usage reported, else the events: vLLM and SGLang send a token an event).")
	m.models.Each(func(model string, st *modelStats) {
		if st.tokenPace.Count() > 0 {
			w.Histogram("fastroute_time_per_output_token_seconds", st.tokenPace, "model", model)
		}
	})
}

// Collector writes the front end's families and the per-worker gauges.
// mode names the selection mode running at the scrape (a reload may change it).
func (m *Metrics) Collector(mode func() string, reg *dataplane.Registry) metrics.Collector {
	return func(w *metrics.Writer) {
		mode := mode()
		w.Header("fastroute_requests_total", "counter", "Requests by route, mode and outcome.")
		for r := range numRoutes {
			for o := range numOutcomes {
				w.Sample("fastroute_requests_total", float64(m.requests[r][o].Value()),
					"route", routeNames[r], "mode", mode, "outcome", outcomeNames[o])
			}
		}
		w.Header("fastroute_phase_requests_total", "counter", "Requests by phase (aggregated: whole on one worker; prefill and decode: the legs of a split request) and outcome.")
		for p := range numPhases {
			for o := range numOutcomes {
				w.Sample("fastroute_phase_requests_total", float64(m.phases[p][o].Value()), "phase", phaseNames[p], "outcome", outcomeNames[o])
			}
		}
		w.Header("fastroute_prefill_seconds", "histogram", "Time of the prefill leg of split requests, to its answer's end.")
		w.Histogram("fastroute_prefill_seconds", m.prefillTime)
		w.Header("fastroute_disagg_fallbacks_total", "counter", "Split requests run whole on their decode worker, by reason: no routable, free prefill worker (no_prefill_worker), both picks one worker of role both (one_worker), the prefill pick's engine queue at router.disaggregation.max_prefill_queue (prefill_queue), the decode worker holding all of the prompt but less than router.disaggregation.min_prefill_tokens (cached).")
		for i := dataplane.SplitNoPrefill; i < numSplits; i++ {
			w.Sample("fastroute_disagg_fallbacks_total", float64(m.disaggFallbacks[i].Value()), "reason", splitReasons[i])
		}
		for _, f := range []struct {
			name, typ, help string
			value           float64
		}{
			{"fastroute_retries_total", "counter", "Requests moved to another worker after a transport failure before the first byte, an answer of a status router.retry_statuses names, or a 404 to a WebSocket session that names no model.", float64(m.retries.Value())},
			{"fastroute_retries_refused_total", "counter", "Requests not moved to another worker, though they could have been, because router.retry_budget's share of requests were on a retry already.", float64(m.retriesRefused.Value())},
			{"fastroute_websocket_sessions", "gauge", "WebSocket sessions open, each holding its worker's reservation until it closes.", float64(m.tunnels.Load())},
			{"fastroute_retrying_requests", "gauge", "Requests on a retry now (counted while router.retry_budget is set).", float64(m.retrying.Load())},
			{"fastroute_response_search_moves_total", "counter", "Requests for a stored response (Responses API) no worker was known to hold, moved on from a worker that answered 404.", float64(m.searchMoves.Value())},
			{"fastroute_context_moves_total", "counter", "Requests a worker refused as longer than its context (a 400 saying so), moved on to a worker of a longer context.", float64(m.contextMoves.Value())},
			{"fastroute_proxy_protocol_refusals_total", "counter", "Client connections closed unserved for want of the PROXY protocol header they must begin with (none, malformed, or not whole within limits.read_timeout).", float64(m.proxyRefusals.Value())},
			{"fastroute_accept_shortages_total", "counter", "Accepts of client connections that failed for want of file descriptors or kernel memory (each followed by a pause of 5 ms to 1 s and another accept).", float64(m.acceptShortages.Value())},
			{"fastroute_client_connections", "gauge", "Client connections open (accepted, not yet closed).", float64(m.openConnections())},
			{"fastroute_client_connections_max", "gauge", "The most client connections open at once (limits.max_connections); beyond, new ones wait in the listen queue.", float64(m.maxConnections.Load())},
			{"fastroute_max_connections_reached_total", "counter", "Times the listener stopped accepting with limits.max_connections client connections open.", float64(m.connectionsFull.Value())},
			{"fastroute_queued_requests", "gauge", "Requests waiting in the router's queue for a busy worker (router.queue).", float64(m.queue.Waiting())},
			{"fastroute_queue_full_total", "counter", "Requests answered 429 at once because the router's queue was full.", float64(m.queueFull.Value())},
			{"fastroute_queue_displaced_total", "counter", "Requests answered 429 after their place in the full queue went to a request of lower priority (the body's priority field, lower is sooner).", float64(m.queueDisplaced.Value())},
			{"fastroute_queue_timeouts_total", "counter", "Requests answered 429 after waiting router.queue.timeout in the queue.", float64(m.queueTimeouts.Value())},
		} {
			w.Single(f.name, f.typ, f.help, f.value)
		}
		if m.keys != nil && m.keys.On() {
			writeKeyMetrics(w, m.keys)
		}
		if t := m.aliases.Load(); t != nil {
			writeAliasMetrics(w, t)
		}
		if t := m.mirrors.Load(); t != nil {
			writeMirrorMetrics(w, t)
		}
		w.Header("fastroute_queue_wait_seconds", "histogram", "Time requests that found their workers busy waited in the queue before one took them.")
		w.Histogram("fastroute_queue_wait_seconds", m.queueWait)
		w.Header("fastroute_route_seconds", "histogram", "Time to select and reserve a worker.")
		w.Histogram("fastroute_route_seconds", m.routeTime)
		w.Header("fastroute_upstream_first_byte_seconds", "histogram", "Time from dispatch to the worker's response headers.")
		w.Histogram("fastroute_upstream_first_byte_seconds", m.firstByte)
		w.Header("fastroute_request_seconds", "histogram", "Time from request arrival to the end of the answer.")
		w.Histogram("fastroute_request_seconds", m.total)
		m.writeModels(w)

		workers := reg.All()
		w.Header("fastroute_worker_inflight", "gauge", "Requests holding a reservation on the worker.")
		for _, wk := range workers {
			w.Sample("fastroute_worker_inflight", float64(wk.Occupancy()), "worker", strconv.FormatUint(wk.ID(), 10))
		}
		w.Header("fastroute_worker_weight", "gauge", "Telemetry weight of the worker (before dividing by 1+occupancy).")
		for _, wk := range workers {
			w.Sample("fastroute_worker_weight", wk.Weight(), "worker", strconv.FormatUint(wk.ID(), 10))
		}
		w.Header("fastroute_worker_prefix_cache_hit_ratio", "gauge",
			"Share of prompt tokens the worker's engine found in its prefix cache lately, as its metrics say (vLLM's counters over a second or more, SGLang's cache_hit_rate); absent while unknown.")
		for _, wk := range workers {
			if st := wk.Engine(); st != nil && st.PrefixHitRatio >= 0 {
				w.Sample("fastroute_worker_prefix_cache_hit_ratio", st.PrefixHitRatio, "worker", strconv.FormatUint(wk.ID(), 10))
			}
		}
		writeEngineCosts(w, workers)
		for _, f := range []struct { // a 1 while the worker is out of rotation for that reason
			name, help string
			is         func(*dataplane.Worker) bool
		}{
			{"fastroute_worker_ejected", "1 while the worker is ejected by the passive health check.",
				func(wk *dataplane.Worker) bool { until, _ := wk.Ejected(); return !until.IsZero() }},
			{"fastroute_worker_down", "1 while the worker is out of rotation by hand (PATCH /workers/{id} {\"down\":true}).", (*dataplane.Worker).Down},
			{"fastroute_worker_asleep", "1 while the worker's engine says it sleeps (vLLM's sleep mode), out of rotation.", (*dataplane.Worker).Asleep},
			{"fastroute_worker_stalled", "1 while the worker's engine shows requests running and no token generated for telemetry.engine.stall_after, out of rotation.", (*dataplane.Worker).Stalled},
		} {
			w.Header(f.name, "gauge", f.help)
			for _, wk := range workers {
				v := 0.0
				if f.is(wk) {
					v = 1
				}
				w.Sample(f.name, v, "worker", strconv.FormatUint(wk.ID(), 10))
			}
		}
		writeWorkerStats(w, workers, m.statsOf)
		w.Single("fastroute_ejections_total", "counter", "Workers taken out of rotation after consecutive 5xx answers or transport failures.",
			float64(reg.Ejections()))
	}
}

// writeEngineCosts writes how the engine-cost modes price each worker with
// a fresh engine reading and a capacity, learned or stood in for, and the
// tokens relayed from those the router reads itself.
func writeEngineCosts(w *metrics.Writer, workers []*dataplane.Worker) {
	for _, f := range []struct {
		name, help string
		value      func(st *engine.Stats, occupancy int64) float64
	}{
		{"fastroute_worker_engine_capacity", "Tokens a second the engine-cost modes take the worker's engine to generate: its learned batch size times its speed per running request (learned, or until then its engine's own mean gap between tokens), or while that speed is unknown a stand-in from the other engines' (fastroute_worker_engine_stand_in); absent without a fresh reading or any speed known.",
			func(st *engine.Stats, _ int64) float64 { return cmp.Or(st.Capacity(), st.StandIn) }},
		{"fastroute_worker_engine_stand_in", "1 while the worker's engine is priced at a stand-in capacity (its own speed not known yet), 0 once known.",
			func(st *engine.Stats, _ int64) float64 {
				if st.Capacity() == 0 {
					return 1
				}
				return 0
			}},
		{"fastroute_worker_engine_cost", "The worker's cost to the engine-cost modes now, lower is cheaper: its engine's queue at the last reading and the router's requests since, plus one, over its capacity, raised while its KV cache is over 80% full.",
			func(st *engine.Stats, occupancy int64) float64 { c, _ := st.Cost(occupancy); return c }},
	} {
		w.Header(f.name, "gauge", f.help)
		for _, wk := range workers {
			if st := wk.Engine(); st != nil {
				if _, priced := st.Cost(0); priced {
					w.Sample(f.name, f.value(st, wk.Occupancy()), "worker", strconv.FormatUint(wk.ID(), 10))
				}
			}
		}
	}
	const relayed = "fastroute_worker_relayed_tokens_total"
	w.Header(relayed, "counter", "Tokens of the answers the router relayed from a worker whose engine gives no metrics, from which it learns the engine's speed itself (an engine's own counter serves for the others).")
	for _, wk := range workers {
		if tokens := wk.Relayed().Tokens; tokens > 0 || wk.CountsTokens() {
			w.Sample(relayed, float64(tokens), "worker", strconv.FormatUint(wk.ID(), 10))
		}
	}
}
