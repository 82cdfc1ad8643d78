package frontend

import "errors"

// RetryBudget caps the requests on a retry at once, as Envoy's and
// Linkerd's retry budgets do: a request may move to another worker only
// while fewer than max(MinRetries, Percent% of the requests holding a
// worker) requests are on a retry. So a failing fleet gets each request
// once more at most for a share of them, not router.retries more times for
// every one of them. A request on a retry stays counted until it ends,
// whatever its tries after. Percent 0: no budget.
type RetryBudget struct {
	Percent    float64
	MinRetries int64
}

// SetRetryBudget sets the retry budget of the requests picked from now on
// (a Percent of 0: none).
func (s *Server) SetRetryBudget(b RetryBudget) {
	if b.Percent <= 0 {
		s.budget.Store(nil)
		return
	}
	s.budget.Store(&b)
}

// errRetryBudget is why a request that could have moved to another worker
// did not.
var errRetryBudget = errors.New("not retried: the retry budget is spent (router.retry_budget: too many requests are on a retry)")

// holdWorker counts a request that has its worker among those the budget
// is a share of, while a budget is set.
func (ex *exchange) holdWorker() {
	if ex.s.budget.Load() != nil {
		ex.s.holding.Add(1)
		ex.inBudget = true
	}
}

// mayRetry reports whether the exchange may move to another worker now:
// a request counted in the budget's share (holdWorker) takes a place among
// the requests on a retry, once (its later retries keep it), while there
// is one; refused, it is counted (fastroute_retries_refused_total).
func (ex *exchange) mayRetry() bool {
	s := ex.s
	b := s.budget.Load()
	if b == nil || ex.onRetry || !ex.inBudget {
		return true
	}
	limit := max(b.MinRetries, int64(b.Percent/100*float64(s.holding.Load())))
	if s.retrying.Add(1) > limit {
		s.retrying.Add(-1)
		s.metrics.retriesRefused.Inc()
		return false
	}
	ex.onRetry = true
	return true
}

// releaseBudget takes the ended exchange out of the budget's counts.
func (ex *exchange) releaseBudget() {
	if !ex.inBudget {
		return
	}
	ex.s.holding.Add(-1)
	if ex.onRetry {
		ex.s.retrying.Add(-1)
	}
	ex.inBudget, ex.onRetry = false, false
}
