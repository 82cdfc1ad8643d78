package engine

import (
	"math"
	"time"
)

// Stats is what the router knows of one engine at one moment: the last
// reading, what it learned from the readings so far, and its own in-flight
// count on the worker when the reading arrived. It is immutable once
// published; the request path reads it through an atomic pointer.
type Stats struct {
	Reading
	// Slots is the batch size: the configured max_inflight, else what the
	// engine reports (SGLang), else the most requests seen running at once.
	Slots float64
	// Admit is the learned in-flight limit: two batches (one running, one
	// queued behind it) once the batch size is known, because the engine
	// reports it (SGLang) or was seen queueing behind a full batch; 0 until
	// then.
	Admit int64
	// TokenRate is the learned decode speed, in tokens per second per
	// running request; until two readings a second apart saw the engine
	// busy and its token counter move, the speed its inter-token latency
	// histogram gives over its life (RateFromGaps), else 0.
	TokenRate float64
	// RateFromGaps says TokenRate is the engine's own mean gap between
	// tokens inverted, not yet learned.
	RateFromGaps bool
	// Occupancy is the router's in-flight count on the worker that the
	// reading is taken to hold: the larger of its count when the scrape
	// was sent (the scraper sets it) and when the reading arrived
	// (Prepare's argument); later dispatches and completions are the
	// difference. A request that ended while the scrape was under way may
	// still be in the engine's counts: taken for another client's, it made
	// an idle engine look busy until its next reading.
	Occupancy int64
	// PrefixHitRatio is the share of prompt tokens the engine found in its
	// prefix cache lately: over the last window of a second or more in
	// which vLLM's counters moved, or SGLang's own rate; -1 while unknown.
	PrefixHitRatio float64
	// StillFor is how long the engine has had requests running without
	// generating a token, as its readings show it (its token counter
	// unmoved since the first reading of the stretch); 0 while it
	// generates, runs nothing, or reports no token counter.
	StillFor time.Duration
	// Stalled is set by the scraper once StillFor reaches its StallAfter:
	// the engine is taken to be hung.
	Stalled bool
	// StandIn, while the engine's own capacity is unknown (its speed not
	// learned yet: it just joined, or it exports no token counter), is
	// the capacity it is priced at, set by the router from the other
	// engines' learned speeds (0: none; then it has no cost).
	StandIn float64

	// Set by Prepare: Cost is queued + occupancy + 1, times scale.
	queued float64 // max(0, Running + Waiting − Occupancy): the engine's requests beyond the router's
	scale  float64 // KV penalty / (Capacity, else StandIn); 0 while both are unknown
}

// Prepare stamps the router's occupancy as the reading arrived (kept
// when the count at its scrape's sending was larger) and precomputes the
// cost's terms, so Cost is an add and a multiply. Call it once, before the
// Stats are published.
func (s *Stats) Prepare(occupancy int64) {
	s.Occupancy = max(s.Occupancy, occupancy)
	// The engine's requests beyond the router's own at the reading (other
	// routers' and clients'): never below none. An engine that shows
	// fewer than the router has in flight has not taken them all in yet
	// (sent, not yet queued): the router's own requests count whole, or
	// a worker just sent two would look idle until its next reading.
	s.queued = max(0, s.Running+s.Waiting-float64(s.Occupancy))
	s.scale = 0
	c := s.Capacity()
	if c == 0 {
		c = s.StandIn
	}
	if c > 0 {
		s.scale = 1 / c
		if s.KVUsage > KVPenaltyFrom {
			s.scale *= 1 + 20*(s.KVUsage-KVPenaltyFrom)
		}
	}
}

// KVPenaltyFrom is the KV cache usage above which the cost rises: an engine
// whose cache is nearly full preempts or queues new requests.
const KVPenaltyFrom = 0.8

// Capacity is the learned throughput, Slots × TokenRate tokens per second,
// or 0 while the speed is unknown.
func (s *Stats) Capacity() float64 { return s.Slots * s.TokenRate }

// Cost is the expected time to drain the engine's work including one more
// request: (Load + 1) / Capacity (StandIn while the capacity is unknown),
// raised by 1 + 20 × (KVUsage − 0.8) when the cache is over 80% full (×5
// when full). Lower is better. It reports false while both are unknown (or
// before Prepare). It does not allocate.
func (s *Stats) Cost(occupancy int64) (float64, bool) {
	if s.scale == 0 {
		return 0, false
	}
	return (s.queued + float64(max(0, occupancy)) + 1) * s.scale, true
}

// learnWindow is the shortest span a speed sample covers: at 50 ms scrapes
// a slow engine's counter moves only every few readings.
const learnWindow = time.Second

// learnWeight is the share a new speed sample takes in the running average.
const learnWeight = 0.3

// Learner folds the successive readings of one engine into Stats.
// It is used by one goroutine.
type Learner struct {
	prev       Reading
	have       bool
	slots      float64
	full       bool // a queue stayed behind running requests: slots is the batch size
	rate       float64
	winStart   time.Time
	winTokens  float64 // tokens generated in the window
	winRunning float64 // running requests integrated over the window (request-seconds)
	// The prefix cache's window: its start and the counters there, and
	// the hit ratio of the last window that saw queries.
	prefixStart        time.Time
	prefixQ0, prefixH0 float64
	prefixRatio        float64
	prefixSeen         bool // prefixRatio holds a window's ratio
	// still is the first reading of the current stretch in which requests
	// ran and the token counter did not move (zero: none).
	still time.Time
}

// Observe adds a reading and returns the Stats it leads to; the caller sets
// Occupancy (the router's requests in flight as the scrape left).
// fixedSlots, when positive, replaces the learned batch size.
func (l *Learner) Observe(r Reading, fixedSlots int) Stats {
	l.slots = max(l.slots, r.Running)
	// A queue behind the same running count in two readings in a row: the
	// batch is full. One reading of a queue may only be requests the
	// scheduler admits at its next step (a ramp), and a batch size learned
	// from that would cap the worker below what it runs.
	queued := r.Waiting > 0 && r.Running > 0
	l.full = l.full || (queued && l.have && l.prev.Waiting > 0 && l.prev.Running == r.Running)
	if l.have && r.Tokens >= l.prev.Tokens && l.prev.Tokens >= 0 && r.At.After(l.prev.At) {
		dt := r.At.Sub(l.prev.At).Seconds()
		l.winTokens += r.Tokens - l.prev.Tokens
		l.winRunning += (r.Running + l.prev.Running) / 2 * dt
		if r.At.Sub(l.winStart) >= learnWindow && l.winRunning > 0 && l.winTokens > 0 {
			// Not a window in which next to nothing ran (a count of 1e-300,
			// say): its tokens over it are no speed, and infinite.
			if sample := l.winTokens / l.winRunning; sample <= math.MaxFloat64 {
				if l.rate == 0 {
					l.rate = sample
				} else {
					l.rate += learnWeight * (sample - l.rate)
				}
			}
			l.winStart, l.winTokens, l.winRunning = r.At, 0, 0
		}
	} else {
		// First reading, or the counter went back (the engine restarted).
		l.winStart, l.winTokens, l.winRunning = r.At, 0, 0
	}
	l.observePrefix(r)
	l.observeStill(r)
	l.prev, l.have = r, true
	slots, known := max(l.slots, 1), l.full
	switch {
	case fixedSlots > 0:
		slots, known = float64(fixedSlots), true
	case r.MaxRunning > 0:
		slots, known = r.MaxRunning, true
	}
	st := Stats{Reading: r, Slots: slots, TokenRate: l.rate, PrefixHitRatio: -1}
	if l.rate == 0 && r.TokenGaps > 0 && r.TokenGapSeconds > 0 {
		// Not learned yet (the router just started, or the engine joined,
		// or it was idle since): its own history prices it at once. The
		// first learned sample replaces it rather than blends with it:
		// the gaps leave out each request's wait for its first token,
		// which the learned speed counts.
		if rate := r.TokenGaps / r.TokenGapSeconds; rate <= math.MaxFloat64 {
			st.TokenRate, st.RateFromGaps = rate, true
		}
	}
	if !l.still.IsZero() {
		st.StillFor = r.At.Sub(l.still)
	}
	switch {
	case r.PrefixHitRate >= 0:
		st.PrefixHitRatio = r.PrefixHitRate
	case l.prefixSeen:
		st.PrefixHitRatio = l.prefixRatio
	}
	if known {
		st.Admit = 2 * int64(slots)
	}
	return st
}

// observeStill follows the stretch of readings in which the engine runs
// requests and its token counter stands still: it starts at the first
// such reading and ends at one that finds the counter moved (or gone
// back: a restart), nothing running, or no counter.
func (l *Learner) observeStill(r Reading) {
	switch {
	case r.Running <= 0 || r.Tokens < 0:
		l.still = time.Time{}
	case !l.have || r.Tokens != l.prev.Tokens || l.still.IsZero():
		l.still = r.At // running from here on; still until the counter moves
	}
}

// observePrefix closes a prefix cache window of learnWindow or more in
// which the engine looked up prompt tokens: the hits over the queries. A
// counter that went back (a restart) starts a new window.
func (l *Learner) observePrefix(r Reading) {
	switch {
	case r.PrefixQueries < 0:
		return
	case !l.have || l.prefixStart.IsZero() || r.PrefixQueries < l.prefixQ0 || r.PrefixHits < l.prefixH0:
		l.prefixStart, l.prefixQ0, l.prefixH0 = r.At, r.PrefixQueries, r.PrefixHits
	case r.At.Sub(l.prefixStart) >= learnWindow && r.PrefixQueries > l.prefixQ0:
		l.prefixRatio = min((r.PrefixHits-l.prefixH0)/(r.PrefixQueries-l.prefixQ0), 1)
		l.prefixSeen = true
		l.prefixStart, l.prefixQ0, l.prefixH0 = r.At, r.PrefixQueries, r.PrefixHits
	}
}
