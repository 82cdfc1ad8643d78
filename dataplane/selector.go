package dataplane

import (
	"fmt"
	"math"
	"strconv"
	"sync/atomic"

	"github.com/fastroute/fastroute/pickers"
)

// MaxAttempts bounds the workers one request may try: the first plus retries.
const MaxAttempts = 8

// Request is what selection needs to know about one request: what the
// client sent that routes it, and what routing made of that. The zero value
// asks for any worker; it is reused across requests through Reset, and its
// byte fields keep their capacity, so the front end fills them with append.
type Request struct {
	// Model is the body's model field: an adapter's name routes the
	// request to the workers holding the adapter.
	Model []byte
	// Session is the request's session id (ignored while session affinity
	// is off): its pin, else the worker its id hashes to.
	Session []byte
	// SessionHint marks a Session that is a key the client's library set
	// in the body (OpenAI's prompt_cache_key, an Anthropic request's
	// metadata.user_id), not the session header: many
	// clients may share one (an application's), so its worker is never a
	// hard pin and is preferred only while it is within
	// Routing.PrefixSlack requests of the least loaded candidate, as a
	// prompt prefix's is.
	SessionHint bool
	// CacheKeys are the keys of an embedding request's inputs: the worker
	// that served most of them is preferred.
	CacheKeys []uint64
	// PrefixKeys key the prompt's prefixes (affinity.PrefixHasher): the
	// worker last sent the longest of them is preferred while it is within
	// Routing.PrefixSlack requests of the least loaded candidate
	// (withinSlack).
	PrefixKeys []uint64
	// RecordKeys are keys recorded where the request goes beside
	// PrefixKeys, and routed by nowhere: with Routing.CachedSplits a whole
	// request routes by its prompt's keys in the decode key space
	// (affinity.DecodeKeys) and records the prompt's own keys here too,
	// since its worker prefills it.
	RecordKeys []uint64
	// PromptBytes is the length of a split request's body, which
	// Routing.MinPrefillTokens measures (4 bytes a token).
	PromptBytes int
	// Response is the id of a stored response the request names (OpenAI's
	// Responses API: GET /v1/responses/{id}, its cancel, a new response's
	// previous_response_id): it goes to the worker that holds it, or
	// searches the workers for it (Searching).
	Response []byte
	// WorkerID names the worker (direct mode, a named phase worker; routing
	// sets it for a hard session pin): that worker or an error, never
	// another. 0: none.
	WorkerID uint64
	// DPRank pins the data-parallel rank when HasDPRank is set.
	DPRank    int
	HasDPRank bool
	// Phase picks from the pool of that phase (disaggregation) with its
	// picker; PhaseAny: every worker.
	Phase Phase
	// Query marks a pick that is only reported (x-query-instance-id), not
	// dispatched: routing honours what it knows and records nothing (no
	// prompt prefix), as a query pins no session.
	Query bool

	// What routing decided (route): a worker to take while it is free (a
	// soft pin, a cache hit, a rendezvous placement; 0: none) and the
	// pinned rank there; the worker last sent the prompt's longest known
	// prefix (0: none); the group the candidates are restricted to (an
	// adapter's holders, a base model's servers; nil: all); a hard session
	// pin.
	preferID      uint64
	preferRank    int
	hasPreferRank bool
	preferBounded bool // preferID is a SessionHint's: within Routing.PrefixSlack only
	prefixID      uint64
	group         *Group
	hard          bool
	stored        bool // WorkerID holds Response
	searching     bool // no worker is known to hold Response
	minContext    int  // a worker refused it as longer than its context: only longer ones (LongerContext); 0: any
	backupPass    bool // no other candidate could take it: backup workers may (selectFiltered)

	exclude  [MaxAttempts]uint64
	nExclude int
	// scratch holds the filtered candidates; it keeps its capacity across
	// Reset so a reused Request filters without allocating.
	scratch candidates
}

// Reset clears r for the next request. Field by field: copying a fresh
// Request would move the scratch space too, which costs more than the rest of
// a pinned selection. The exclusions and the scratch space need no clearing
// (nExclude bounds the first, selectFiltered resets the second).
func (r *Request) Reset() {
	r.Model, r.Session, r.CacheKeys, r.Response = r.Model[:0], r.Session[:0], r.CacheKeys[:0], r.Response[:0]
	r.SessionHint, r.preferBounded = false, false
	r.PrefixKeys, r.RecordKeys, r.prefixID, r.PromptBytes = r.PrefixKeys[:0], r.RecordKeys[:0], 0, 0
	r.WorkerID, r.DPRank, r.HasDPRank, r.Phase, r.Query = 0, 0, false, PhaseAny, false
	r.preferID, r.preferRank, r.hasPreferRank = 0, 0, false
	r.group, r.hard, r.stored, r.searching = nil, false, false, false
	r.nExclude, r.minContext, r.backupPass = 0, 0, false
}

// Attempts returns how many workers this request has been moved away from.
func (r *Request) Attempts() int { return r.nExclude }

// Searching reports a request naming a stored response that no worker is
// known to hold: a worker that answers it 404 does not hold it, and the
// request may move on to the next (Retry), up to MaxAttempts workers.
func (r *Request) Searching() bool { return r.searching }

func (r *Request) excluded(id uint64) bool {
	for _, x := range r.exclude[:r.nExclude] {
		if x == id {
			return true
		}
	}
	return false
}

// Selector routes, picks and reserves workers: the allocation-free,
// lock-free core of the request path.
type Selector struct {
	reg     *Registry
	policy  atomic.Pointer[policy] // swapped whole by SetPolicy (config reload)
	routing atomic.Pointer[Routing]
	// Requests with prefix keys (PrefixRouted): sent to the holder of
	// their longest known prefix, not sent there, no prefix known.
	prefixTaken, prefixPassed, prefixUnknown atomic.Uint64
}

// policy is how the selector picks; one request reads one policy throughout.
type policy struct {
	mode     pickers.Mode
	picker   pickers.Picker
	phases   [3]phasePolicy // by Phase: the picker of each pool
	busy     int64
	cpuRatio float64              // device-aware-weighted's CPU overflow rule; 0: off
	cpuPick  *pickers.LeastLoaded // inside the CPU group
}

// phasePolicy is the picker of one phase's pool.
type phasePolicy struct {
	mode   pickers.Mode // the mode in use
	own    pickers.Mode // the phase's configured mode; "": the router's
	picker pickers.Picker
}

// NewSelector returns a selector over reg. busyThreshold caps the requests in
// flight per worker (0 = no cap). The CPU overflow rule is off until
// Serves reports whether a routable worker would take a request for
// model now (Snapshot.Serves).
func (s *Selector) Serves(model []byte) bool { return s.reg.Snapshot().Serves(model) }

// Lists reports whether a routable worker names model now
// (Snapshot.Lists).
func (s *Selector) Lists(model []byte) bool { return s.reg.Snapshot().Lists(model) }

// SetPolicy sets a ratio; routing resolves LoRA adapters and nothing more
// until SetRouting says otherwise.
func NewSelector(reg *Registry, mode pickers.Mode, busyThreshold int) (*Selector, error) {
	s := &Selector{reg: reg}
	s.routing.Store(&Routing{})
	return s, s.SetPolicy(mode, busyThreshold, 0)
}

// SetPolicy replaces the mode, the busy threshold and the CPU overflow
// ratio for the requests selected from now on; those in flight keep what
// they have.
//
// The CPU overflow rule is the reference framework's for
// device-aware-weighted: while the fleet has both GPU and CPU workers and
// no engine readings to price them, the CPU group takes a request only
// while cpu_inflight < gpu_inflight × cpu_count / (cpuRatio × gpu_count),
// least-loaded inside; the GPUs take the rest by weight.
func (s *Selector) SetPolicy(mode pickers.Mode, busyThreshold int, cpuRatio float64) error {
	p, err := pickers.New(mode)
	if err != nil {
		return err
	}
	if busyThreshold < 0 {
		return fmt.Errorf("busy_threshold: %d is negative", busyThreshold)
	}
	if cpuRatio < 0 {
		return fmt.Errorf("cpu_ratio: %v is negative", cpuRatio)
	}
	np := &policy{mode: mode, picker: p, busy: int64(busyThreshold), cpuRatio: cpuRatio, cpuPick: &pickers.LeastLoaded{}}
	np.phases[PhaseAny] = phasePolicy{mode: mode, picker: p}
	var prefill, decode pickers.Mode
	if old := s.policy.Load(); old != nil {
		prefill, decode = old.phases[PhasePrefill].own, old.phases[PhaseDecode].own
	}
	np.setPhases(prefill, decode)
	s.policy.Store(np)
	return nil
}

// SetPhaseModes gives the prefill and decode pools pickers of their own
// ("" keeps the router's mode for that pool), from the next request on.
func (s *Selector) SetPhaseModes(prefill, decode pickers.Mode) error {
	for _, m := range []pickers.Mode{prefill, decode} {
		if m == pickers.ModeDirect {
			return fmt.Errorf("mode %q cannot pick a phase's worker: it needs the worker named", m)
		}
		if _, err := pickers.New(m); m != "" && err != nil {
			return err
		}
	}
	np := *s.policy.Load()
	np.setPhases(prefill, decode)
	s.policy.Store(&np)
	return nil
}

// setPhases gives each phase a picker of its own (a round-robin turn is
// per pool): of its own mode, or of the router's where that is "".
func (p *policy) setPhases(prefill, decode pickers.Mode) {
	for ph, own := range [...]pickers.Mode{PhasePrefill: prefill, PhaseDecode: decode} {
		if ph == int(PhaseAny) {
			continue
		}
		m := own
		if m == "" {
			m = p.mode
		}
		pk, _ := pickers.New(m)
		p.phases[ph] = phasePolicy{mode: m, own: own, picker: pk}
	}
}

// overflow applies the CPU overflow rule: the device group to pick from,
// or nil when the rule does not apply (off, another mode, one kind of
// device, or engine readings that price every worker).
func (p *policy) overflow(snap *Snapshot) (group *candidates, picker pickers.Picker) {
	if p.cpuRatio == 0 || p.mode != pickers.ModeWeighted || len(snap.cpus.ids) == 0 {
		return nil, nil
	}
	if _, priced := snap.candidates.Cost(0); priced {
		return nil, nil
	}
	var gpuIn, cpuIn int64
	for _, o := range snap.gpus.occ {
		gpuIn += o.Load()
	}
	for _, o := range snap.cpus.occ {
		cpuIn += o.Load()
	}
	if float64(cpuIn)*p.cpuRatio*float64(len(snap.gpus.ids)) < float64(gpuIn)*float64(len(snap.cpus.ids)) {
		return &snap.cpus, p.cpuPick
	}
	return &snap.gpus, p.picker
}

// limit is w's in-flight cap: its own max_inflight, else the one learned
// from its engine (two batches), else the busy threshold. A threshold of 0
// (no cap) also turns the learned one off.
func (p *policy) limit(w *Worker) int64 {
	if m := w.spec.MaxInflight; m > 0 {
		return int64(m)
	}
	if p.busy > 0 {
		if st := w.engine.Load(); st != nil && st.Admit > 0 {
			return st.Admit
		}
	}
	return p.busy
}

// Registry returns the registry the selector reads.
func (s *Selector) Registry() *Registry { return s.reg }

// Select routes req (LoRA adapter, session pin, embedding cache) and
// reserves one slot on the worker it picks in res, all on the registry's
// current snapshot, so one request sees one view of the workers.
func (s *Selector) Select(req *Request, res *Reservation) error {
	return s.routeAndPick(s.routing.Load(), s.reg.Snapshot(), req, res)
}

// routeAndPick routes req and reserves the worker it picks, both on snap.
func (s *Selector) routeAndPick(rt *Routing, snap *Snapshot, req *Request, res *Reservation) error {
	if len(req.Model)+len(req.Session)+len(req.CacheKeys)+len(req.Response)+len(req.PrefixKeys)+len(req.RecordKeys) == 0 {
		return s.pick(snap, req, res) // nothing to route by
	}
	if err := s.route(rt, snap, req); err != nil {
		return err
	}
	err := s.pinFailed(rt, req, s.pick(snap, req, res))
	s.sentPrefix(rt, req, res, err)
	return err
}

// sentPrefix records where a request with prefix keys went (err == nil):
// that worker now holds its prompt's prefixes, under the keys it routes by
// and its RecordKeys. A query went nowhere.
func (s *Selector) sentPrefix(rt *Routing, req *Request, res *Reservation, err error) {
	if err == nil && rt.Prefixes != nil && !req.Query {
		rt.Prefixes.Record(req.PrefixKeys, res.Worker().ID())
		rt.Prefixes.Record(req.RecordKeys, res.Worker().ID())
	}
}

// PrefixRouted returns how many requests went to the holder of their
// prompt's longest known prefix (taken), how many did not (passed: the
// holder was busier than Routing.PrefixSlack allows, at its cap, not
// routable or not among the request's candidates) and how many had no
// prefix known (unknown).
func (s *Selector) PrefixRouted() (taken, passed, unknown uint64) {
	return s.prefixTaken.Load(), s.prefixPassed.Load(), s.prefixUnknown.Load()
}

// pick reserves a worker for a routed request on snap.
func (s *Selector) pick(snap *Snapshot, req *Request, res *Reservation) error {
	if snap.Len() == 0 {
		return ErrNoEndpoints
	}
	p := s.policy.Load()
	if req.WorkerID != 0 {
		return s.selectNamed(p, snap, req, res)
	}
	req.backupPass = false // a retry tries the other workers first again
	if p.picker == nil {
		return errMissingWorker
	}
	base := snap.pool(req.Phase)
	if base.Len() == 0 {
		return errNoPhaseWorker[req.Phase]
	}
	if g := req.group; g != nil {
		if g.Len() == 0 {
			return g.noneRoutable()
		}
		base = &g.candidates
	}
	if req.preferID != 0 {
		if i := snap.index(req.preferID); i >= 0 {
			w := snap.workers[i]
			inGroup := req.group == nil || req.group.contains(w.spec.ID)
			if inGroup && s.admits(req, w) && (!req.preferBounded || s.nearLeast(req, base, w)) && w.tryAcquire(p.limit(w)) {
				return s.holdRank(req, w, res, req.preferRank, req.hasPreferRank)
			}
		}
	}
	pp := &p.phases[req.Phase]
	if req.prefixID != 0 && req.nExclude == 0 && (req.group == nil || req.Phase == PhaseAny) {
		if w := s.prefixHolder(p, snap, base, req); w != nil {
			return s.hold(req, w, res)
		}
	}
	if req.nExclude == 0 && (req.group == nil || req.Phase == PhaseAny) && base.backups == 0 {
		// Fast path: pick over the whole set (or the device group the CPU
		// overflow rule names). A busy pick means the policy saw no better
		// free worker, or raced; the filtered path decides. A set with
		// backup workers goes there at once: they are no candidates
		// while another is.
		set, picker := base, pp.picker
		if req.group == nil && req.Phase == PhaseAny {
			if g, gp := p.overflow(snap); g != nil {
				set, picker = g, gp
			}
		}
		w := set.workers[picker.Pick(set.ids, set)]
		if w.tryAcquire(p.limit(w)) {
			return s.hold(req, w, res)
		}
	}
	return s.selectFiltered(p, pp, base, req, res)
}

// prefixHolder reserves the worker that holds the longest known prefix of
// req's prompt when it is a candidate (base, req's group), free, and
// within Routing.PrefixSlack requests of the least loaded candidate
// (withinSlack); nil when it is not taken. The bound is not the mode's own
// measure, so that it holds in every mode, round-robin's and random's too.
func (s *Selector) prefixHolder(p *policy, snap *Snapshot, base *candidates, req *Request) *Worker {
	if i := snap.index(req.prefixID); i >= 0 {
		w := snap.workers[i]
		if h := base.index(w.spec.ID); h >= 0 && s.admits(req, w) && s.withinSlack(req, base, h, s.routing.Load().PrefixSlack) &&
			w.tryAcquire(p.limit(w)) {
			s.prefixTaken.Add(1)
			return w
		}
	}
	s.prefixPassed.Add(1)
	return nil
}

// nearLeast reports whether worker w, a candidate of c, is within
// Routing.PrefixSlack requests of the least busy candidate req may go to
// (withinSlack).
func (s *Selector) nearLeast(req *Request, c *candidates, w *Worker) bool {
	h := c.index(w.spec.ID)
	return h >= 0 && s.withinSlack(req, c, h, s.routing.Load().PrefixSlack)
}

// withinSlack reports whether candidate h of c is no busier than the least
// busy candidate req may go to would be with slack more requests. While
// every such candidate's engine is priced (engine telemetry: Stats.Cost,
// its queue and the router's requests over its learned throughput), busy
// is that cost: a slow engine left idle does not count as the least
// loaded (an idle CPU worker would otherwise pass every prefix on a GPU
// worker with slack requests more), and a holder much slower than the
// cheapest candidate is passed even when idle. Otherwise it is requests
// in flight, and so it is while the holder's own speed is not known (it
// is priced at a stand-in: a probe's price, which keeps an engine of
// unknown speed from being sent many requests at once, and says nothing
// of its speed, would pass every prefix it holds until it is known).
func (s *Selector) withinSlack(req *Request, c *candidates, h int, slack int64) bool {
	if mine, ok := c.ownCost(h); ok {
		least, cheapest := math.Inf(1), -1
		for i, w := range c.workers {
			if !s.admits(req, w) {
				continue
			}
			v, ok := c.Cost(i)
			if !ok {
				cheapest = -1
				break
			}
			if v < least {
				least, cheapest = v, i
			}
		}
		if cheapest >= 0 {
			bound, _ := c.costWith(cheapest, slack)
			return mine <= bound
		}
	}
	return c.occ[h].Load() <= s.leastOccupancy(req, c)+slack
}

// leastOccupancy returns the fewest requests in flight on a worker of c
// that req may go to.
func (s *Selector) leastOccupancy(req *Request, c *candidates) int64 {
	least := int64(math.MaxInt64)
	for i, w := range c.workers {
		if n := c.occ[i].Load(); n < least && s.admits(req, w) {
			least = n
		}
	}
	return least
}

// Retry releases res and reserves another worker, never one this request
// already tried, as routing first decided (it is not routed again). A
// request bound to a named worker cannot move. A search for a stored
// response that finds only busy workers left says so.
func (s *Selector) Retry(req *Request, res *Reservation) error {
	if w := res.Worker(); w != nil && req.nExclude < MaxAttempts {
		req.exclude[req.nExclude] = w.ID()
		req.nExclude++
	}
	res.Release()
	if req.WorkerID != 0 {
		return Errorf(NoEndpoints, "worker %d failed and the request is bound to it", req.WorkerID)
	}
	err := s.pick(s.reg.Snapshot(), req, res)
	s.sentPrefix(s.routing.Load(), req, res, err)
	if e, ok := err.(*Error); ok && e.Code == ResourceExhausted && req.searching {
		return Errorf(ResourceExhausted, "response %s is on none of the %d workers asked, and those not asked yet are busy",
			strconv.Quote(string(req.Response)), req.nExclude)
	}
	return err
}

// admits reports whether req may go to w now: it is eligible, and no
// backup unless no other candidate could take req (backupPass).
func (s *Selector) admits(req *Request, w *Worker) bool {
	return eligible(req, w) && (!w.spec.Backup || req.backupPass)
}

// eligible reports whether req may go to w at all: not tried yet, of a
// role that serves its phase, of a context long enough where one was
// refused.
func eligible(req *Request, w *Worker) bool {
	return !req.excluded(w.spec.ID) && w.spec.Role.serves(req.Phase) && (req.minContext == 0 || w.ContextLen() >= req.minContext)
}

// LongerContext readies req, which worker w refused as longer than its
// context (an engine's 400 saying so), to move on (Retry) only to
// workers of a longer known context: it reports whether a routable
// candidate of req has one, and when it has, Retry takes only such
// workers from then on. False for a worker of unknown context (nothing
// is known to be longer) and a request bound to its worker.
func (s *Selector) LongerContext(req *Request, w *Worker) bool {
	have := w.ContextLen()
	if have <= 0 || req.WorkerID != 0 {
		return false
	}
	c := s.reg.Snapshot().pool(req.Phase)
	if req.group != nil {
		c = &req.group.candidates
	}
	for _, x := range c.workers {
		if x.spec.ID != w.spec.ID && x.ContextLen() > have && eligible(req, x) { // a backup too: the retry's second pass takes it
			req.minContext = have + 1
			return true
		}
	}
	return false
}

// hold records the reservation with its data-parallel rank: the pinned one
// where it fits the worker, else the worker's least loaded.
func (s *Selector) hold(req *Request, w *Worker, res *Reservation) error {
	return s.holdRank(req, w, res, req.DPRank, req.HasDPRank)
}

func (s *Selector) holdRank(req *Request, w *Worker, res *Reservation, rank int, pinned bool) error {
	if !pinned || rank < 0 || rank >= w.spec.DPSize {
		rank = w.leastLoadedRank()
	}
	res.hold(w, req.group, rank)
	return nil
}

func (s *Selector) selectNamed(p *policy, snap *Snapshot, req *Request, res *Reservation) error {
	i := snap.index(req.WorkerID)
	if i < 0 {
		if w, ok := s.reg.Get(req.WorkerID); ok {
			why := w.unroutable()
			if why == "" {
				why = "just back in rotation" // after the snapshot was read
			}
			return Errorf(NoEndpoints, "worker %d is not routable (%s)", req.WorkerID, why)
		}
		return Errorf(InvalidArgument, "unknown worker id %d", req.WorkerID)
	}
	w := snap.workers[i]
	if req.excluded(w.spec.ID) {
		return Errorf(NoEndpoints, "worker %d failed and the request is bound to it", req.WorkerID)
	}
	if req.HasDPRank && (req.DPRank < 0 || req.DPRank >= w.spec.DPSize) {
		return Errorf(InvalidArgument, "dp rank %d is outside 0..%d of worker %d", req.DPRank, w.spec.DPSize-1, w.spec.ID)
	}
	if g := req.group; g != nil && !g.contains(w.spec.ID) {
		return Errorf(InvalidArgument, "worker %d does not hold %s", req.WorkerID, g)
	}
	if !w.spec.Role.serves(req.Phase) {
		return Errorf(InvalidArgument, "worker %d has role %s and does not serve the %s phase", req.WorkerID, w.spec.Role, req.Phase)
	}
	if !w.tryAcquire(p.limit(w)) {
		return ErrResourceExhausted
	}
	return s.hold(req, w, res)
}

// selectFiltered collects the admitted free workers of base and picks among
// them; where none is (every one busy, or none may take req) and base has
// backup workers, among those.
func (s *Selector) selectFiltered(p *policy, pp *phasePolicy, base *candidates, req *Request, res *Reservation) error {
	err := s.selectFree(p, pp, base, req, res)
	if err == nil || base.backups == 0 || req.backupPass {
		return err
	}
	req.backupPass = true
	if berr := s.selectFree(p, pp, base, req, res); berr != ErrNoEndpoints {
		return berr
	}
	return err // no backup may take it either: the others' refusal says why
}

// selectFree collects the admitted free workers of base and picks among them.
func (s *Selector) selectFree(p *policy, pp *phasePolicy, base *candidates, req *Request, res *Reservation) error {
	c := &req.scratch
	for try := 0; try < 3; try++ {
		c.reset()
		admitted := 0
		for _, w := range base.workers {
			if !s.admits(req, w) {
				continue
			}
			admitted++
			if w.free(p.limit(w)) {
				c.add(w)
			}
		}
		if admitted == 0 {
			return ErrNoEndpoints
		}
		if len(c.ids) == 0 {
			if req.group != nil {
				return req.group.allBusy()
			}
			return ErrResourceExhausted
		}
		if pp.mode == pickers.ModeWeighted {
			c.weights.Build()
		}
		if w := c.workers[pp.picker.Pick(c.ids, c)]; w.tryAcquire(p.limit(w)) {
			return s.hold(req, w, res)
		}
	}
	return ErrResourceExhausted
}
