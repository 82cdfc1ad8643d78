package frontend

import (
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/metrics"
	"github.com/valyala/fasthttp"
)

// workerStats are one worker's answers and failures as the router met
// them, per try: a request that moves to another worker counts on both,
// and both legs of a split request count on their workers. They are what
// an operator compares workers by (HAProxy's per-server responses,
// connection and response errors), where fastroute_requests_total says
// only how the fleet answered clients.
type workerStats struct {
	answers   [numStatusClasses]metrics.Counter // answer heads, by status class
	failures  [numFailures]metrics.Counter
	firstByte *metrics.Histogram // from the send to the answer's head
	// From the send to a timed stream's first event leaving (its engine's
	// time to first token, with the router's relay of it).
	firstToken *metrics.Histogram
	// The worker's keep-alive connections (HAProxy's connection attempts
	// and reuses): connections opened, pooled ones its worker had closed
	// (dropped before a request went on them: workerClosed,
	// hostPool.acquire and release, sendOn), and how many are open (dialed
	// and not closed yet: trackedConn.Close).
	connects, closedByWorker metrics.Counter
	open                     atomic.Int64
}

// statusClasses are the label values of answers' status classes.
var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

const numStatusClasses = len(statusClasses)

// failure enumerates the ways a try on a worker fails.
type failure uint8

const (
	failConnect   failure = iota // no connection: refused, unreachable, limits.connect_timeout, no turn to connect
	failTransport                // the connection broke before the answer's head, or the head was not HTTP
	failTimeout                  // no answer head within limits.first_byte_timeout
	failCut                      // the answer broke after its head: a transport error, limits.stream_idle_timeout
	numFailures
)

var failureNames = [numFailures]string{"connect", "transport", "timeout", "cut"}

func newWorkerStats() *workerStats {
	st := &workerStats{firstByte: metrics.NewHistogram(metrics.DefaultBuckets), firstToken: metrics.NewHistogram(firstTokenBuckets),
		connects: metrics.NewCounter(), closedByWorker: metrics.NewCounter()}
	for i := range st.answers {
		st.answers[i] = metrics.NewCounter()
	}
	for i := range st.failures {
		st.failures[i] = metrics.NewCounter()
	}
	return st
}

// noStats stands for a worker no request went to yet (it has no upstream):
// its series are there, at zero, from the start.
var noStats = newWorkerStats()

// answered counts an answer head of the given status that came after d.
func (st *workerStats) answered(status int, d time.Duration) {
	st.answers[min(max(status/100, 1), numStatusClasses)-1].Inc()
	st.firstByte.Observe(d)
}

// failed counts a try that failed (never one its client or its prefill
// stopped: those are not the worker's).
func (st *workerStats) failed(f failure) { st.failures[f].Inc() }

// failureOf says how a try that got no answer head failed.
func failureOf(err error) failure {
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial",
		errors.Is(err, fasthttp.ErrDialTimeout), errors.Is(err, errDialQueue):
		return failConnect
	case isTimeout(err):
		return failTimeout
	}
	return failTransport
}

// statsOf returns the counts of worker w.
func (s *Server) statsOf(w *dataplane.Worker) *workerStats {
	if u, ok := s.upstreams.Load(w); ok {
		return u.stats
	}
	return noStats
}

// writeWorkerStats writes the per-worker families of workers.
func writeWorkerStats(w *metrics.Writer, workers []*dataplane.Worker, statsOf func(*dataplane.Worker) *workerStats) {
	ids := make([]string, len(workers))
	stats := make([]*workerStats, len(workers))
	for i, wk := range workers {
		ids[i], stats[i] = strconv.FormatUint(wk.ID(), 10), statsOf(wk)
	}
	w.Header("fastroute_worker_answers_total", "counter", "Answer heads each worker sent, by status class (a request tried on several workers counts on each; both legs of a split request count).")
	for i, st := range stats {
		for c := range st.answers {
			w.Sample("fastroute_worker_answers_total", float64(st.answers[c].Value()), "worker", ids[i], "code", statusClasses[c])
		}
	}
	w.Header("fastroute_worker_failures_total", "counter", "Tries on each worker that failed, by reason: connect (no connection), transport (the connection broke before the answer's head, or the head was not HTTP), timeout (no head within limits.first_byte_timeout), cut (the answer broke after its head). A client that left is not the worker's failure.")
	for i, st := range stats {
		for f := range st.failures {
			w.Sample("fastroute_worker_failures_total", float64(st.failures[f].Value()), "worker", ids[i], "reason", failureNames[f])
		}
	}
	w.Header("fastroute_worker_first_byte_seconds", "histogram", "Time from sending a request to a worker to its answer's head, per worker.")
	for i, st := range stats {
		w.Histogram("fastroute_worker_first_byte_seconds", st.firstByte, "worker", ids[i])
	}
	w.Header("fastroute_worker_time_to_first_token_seconds", "histogram", "Time from sending a request to a worker to its stream's first event leaving to the client, per worker: streams of generated tokens (chat, completions, /generate) only.")
	for i, st := range stats {
		w.Histogram("fastroute_worker_time_to_first_token_seconds", st.firstToken, "worker", ids[i])
	}
	w.Header("fastroute_worker_connections", "gauge", "Connections open to each worker, carrying a request or kept alive for the next.")
	for i, st := range stats {
		w.Sample("fastroute_worker_connections", float64(st.open.Load()), "worker", ids[i])
	}
	w.Header("fastroute_worker_connects_total", "counter", "Connections opened to each worker; against its answers, how often kept-alive connections were reused.")
	for i, st := range stats {
		w.Sample("fastroute_worker_connects_total", float64(st.connects.Value()), "worker", ids[i])
	}
	w.Header("fastroute_worker_closed_connections_total", "counter", "Kept-alive connections each worker closed (its keep-alive timeout, a restart), dropped before a request went on them.")
	for i, st := range stats {
		w.Sample("fastroute_worker_closed_connections_total", float64(st.closedByWorker.Value()), "worker", ids[i])
	}
}
