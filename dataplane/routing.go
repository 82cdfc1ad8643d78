package dataplane

import (
	"errors"
	"strconv"

	"github.com/fastroute/fastroute/affinity"
)

// MaxSessionID bounds a session id; a longer one is refused.
const MaxSessionID = 256

// MaxResponseID bounds a stored response's id; a longer one is refused.
const MaxResponseID = 256

// MaxCacheKeys bounds the embedding inputs one request is tracked by.
const MaxCacheKeys = 64

// prefillPin marks a session's prefill pin in the session table, apart
// from its decode (or whole-request) pin.
const prefillPin = "\x00prefill"

// Routing is the request policy around the pick: LoRA adapters, session
// pins, the embedding cache and the fallback of split requests. The zero
// value resolves adapters and nothing more.
type Routing struct {
	// Sessions pins sessions while SessionMode is not affinity.Off; the
	// session id comes in the header SessionHeader names.
	Sessions      *affinity.Table
	SessionMode   affinity.Mode
	SessionHeader string
	// EmbedCache steers an embedding request to the worker that served
	// most of its inputs; nil: off.
	EmbedCache *affinity.Cache
	// Responses maps the ids of stored responses (OpenAI's Responses API
	// with store on) to the worker that holds each; nil: a request naming
	// one is routed as any other.
	Responses *affinity.Table
	// Prefixes steers a request to the worker last sent the longest
	// prefix of its prompt (Request.PrefixKeys), where the engine may
	// still hold that prefix's KV cache, while that worker is within
	// PrefixSlack requests of the least loaded candidate (in engine cost
	// while every candidate is priced: Selector.withinSlack); nil: off. The front end keys a prompt in blocks of PrefixBlock bytes, at
	// most PrefixBlocks of them.
	Prefixes     *affinity.Prefixes
	PrefixSlack  int64
	PrefixBlock  int
	PrefixBlocks int
	// PlaceAdapters sends a request for an adapter no routable worker
	// holds (an unknown model name included) to the worker rendezvous
	// hashing of its name picks, instead of a 404 or 503.
	PlaceAdapters bool
	// MinPrefillTokens sends prompts shorter than this (estimated at 4
	// body bytes a token) whole to a decode worker instead of splitting
	// them (Splits).
	MinPrefillTokens int
	// MaxPrefillQueue runs a split request whole on its decode worker
	// while the engine of its prefill pick reports this many requests
	// waiting or more (SelectSplit); 0: never.
	MaxPrefillQueue int
	// PrefillFallback runs a split request whole on its decode worker
	// while no prefill worker is routable (SelectSplit), or, with
	// DecodePrefills, while every one is busy; false: it fails.
	PrefillFallback bool
	// DecodePrefills says decode workers can prefill a request themselves,
	// as vLLM's engines with a KV connector do; SGLang's decode servers
	// only take a prefill's transfer.
	DecodePrefills bool
}

// Splits reports whether a generation request whose body is promptBytes
// long goes to a prefill and a decode worker (disaggregation on): a long
// enough prompt, or one whose prefill worker is named.
func (rt *Routing) Splits(promptBytes int, prefillNamed bool) bool {
	return prefillNamed || promptBytes/4 >= rt.MinPrefillTokens
}

// WantsSession reports whether requests' session ids are used.
func (rt *Routing) WantsSession() bool { return rt.SessionMode != affinity.Off && rt.Sessions != nil }

// WantsCacheKeys reports whether embedding inputs' keys are used.
func (rt *Routing) WantsCacheKeys() bool { return rt.EmbedCache != nil }

// WantsPrefixKeys reports whether prompts' prefix keys are used.
func (rt *Routing) WantsPrefixKeys() bool { return rt.Prefixes != nil }

// CachedSplits reports whether a split request runs whole on its decode
// worker when that worker holds all of its prompt but less than
// MinPrefillTokens (SelectSplit): prefix affinity is on, and decode
// workers prefill (DecodePrefills). The front end then keys the requests
// that go to decode workers in the decode key space (affinity.DecodeKeys).
func (rt *Routing) CachedSplits() bool {
	return rt.Prefixes != nil && rt.DecodePrefills && rt.MinPrefillTokens > 0
}

// SetRouting sets the routing policy. Call it once, before requests flow;
// the session table is told of every worker that leaves from then on.
func (s *Selector) SetRouting(rt Routing) {
	s.routing.Store(&rt)
	if rt.Sessions != nil {
		s.reg.Subscribe(func(w *Worker, c Change) {
			if c == Left {
				rt.Sessions.WorkerLeft(w.ID())
			}
		})
	}
}

// Reroute changes the routing policy for the requests routed from now on
// (a reload): change edits a copy of the one in force, whose tables stay.
func (s *Selector) Reroute(change func(rt *Routing)) {
	rt := *s.routing.Load()
	change(&rt)
	s.routing.Store(&rt)
}

// Routing returns the routing policy (do not modify).
func (s *Selector) Routing() *Routing { return s.routing.Load() }

// route decides from what the client sent where req may and should go on
// snap: the adapter's group, a hard pin (WorkerID) or a worker to prefer.
// The error is final for the request.
func (s *Selector) route(rt *Routing, snap *Snapshot, req *Request) error {
	if len(req.Model) > 0 && req.Phase != PhasePrefill { // a prefill follows its decode's adapter (SelectSplit)
		if err := rt.resolve(snap, req); err != nil {
			return err
		}
	}
	if len(req.Response) > 0 && rt.Responses != nil {
		if err := s.routeResponse(rt, req); err != nil {
			return err
		}
	}
	if len(req.Session) > 0 && rt.WantsSession() {
		if err := rt.routeSession(snap, req); err != nil {
			return err
		}
	}
	if len(req.CacheKeys) > 0 && rt.EmbedCache != nil && req.WorkerID == 0 && req.preferID == 0 {
		req.preferID = rt.cacheHolder(req.CacheKeys)
	}
	if len(req.PrefixKeys) > 0 && rt.Prefixes != nil && req.WorkerID == 0 && req.preferID == 0 {
		if req.prefixID, _ = rt.Prefixes.Holder(req.PrefixKeys); req.prefixID == 0 {
			s.prefixUnknown.Add(1)
		}
	}
	return nil
}

// resolve restricts req to the workers holding the adapter its model
// names, or to those serving the base model it names; with PlaceAdapters,
// an adapter no routable worker holds goes to the worker its name hashes
// to (the same on every replica), which loads it.
func (rt *Routing) resolve(snap *Snapshot, req *Request) error {
	i, err := snap.catalog.Resolve(req.Model)
	var g *Group
	if i >= 0 {
		g = snap.groups[i]
	}
	if rt.PlaceAdapters && (err != nil || (g != nil && g.Len() == 0)) {
		if id, ok := snap.Rendezvous(affinity.Key(req.Model), req.Phase, nil); ok {
			req.preferID = id
		}
		return nil
	}
	if err != nil {
		return &Error{Code: NotFound, Msg: err.Error()}
	}
	if g == nil { // a base model: its servers, when not every worker is one
		g = snap.ModelGroup(req.Model)
	}
	req.group = g
	return nil
}

// routeSession applies the session's pin: hard (the pinned worker or an
// error) or soft (preferred while free; a SessionHint's while near the
// least loaded, and never hard); a session pinned nowhere here prefers the
// worker every router places it on. A prefill's pin is soft in
// both modes: a prefill worker holds no state the decode needs, only a
// prefix cache worth reusing.
func (rt *Routing) routeSession(snap *Snapshot, req *Request) error {
	if len(req.Session) > MaxSessionID && req.Phase != PhasePrefill {
		return Errorf(InvalidArgument, "header %s: session id is longer than %d bytes", rt.SessionHeader, MaxSessionID)
	}
	if req.WorkerID != 0 {
		return nil
	}
	hard := rt.SessionMode == affinity.Hard && req.Phase != PhasePrefill && !req.SessionHint
	pin, st := rt.Sessions.Get(req.Session)
	switch {
	case st == affinity.Pinned && hard:
		// x-dp-rank comes only with x-worker-id, so the pin's rank holds.
		req.WorkerID, req.DPRank, req.HasDPRank, req.hard = pin.Worker, pin.Rank, true, true
	case st == affinity.Pinned:
		req.preferID, req.preferRank, req.hasPreferRank, req.preferBounded = pin.Worker, pin.Rank, true, req.SessionHint
	case st == affinity.Lost && hard:
		rt.Sessions.Drop(req.Session)
		return Errorf(NoEndpoints,
			"session %s was pinned to worker %d, which left; the pin is dropped and the next request is pinned anew",
			strconv.Quote(string(req.Session)), pin.Worker)
	default: // no pin here: where every router places the session
		if id, ok := snap.Rendezvous(affinity.Key(req.Session), req.Phase, req.group); ok {
			req.preferID, req.preferBounded = id, req.SessionHint
		}
	}
	return nil
}

// routeResponse sends a request naming a stored response to the worker
// known to hold it, as a hard pin does: while that worker is not routable
// (unhealthy, draining, ejected, asleep, stalled) the request fails
// naming it, since no other worker has the response. One no worker is
// known to hold searches for it: a request made before this router
// learned the id (its restart, another replica), one whose pin was
// evicted, or one whose worker was removed (it took its responses with
// it). A worker named by x-worker-id stays the one.
func (s *Selector) routeResponse(rt *Routing, req *Request) error {
	if len(req.Response) > MaxResponseID {
		return Errorf(InvalidArgument, "response id is longer than %d bytes", MaxResponseID)
	}
	if req.WorkerID != 0 {
		return nil
	}
	if pin, st := rt.Responses.Get(req.Response); st != affinity.Missing && s.registered(pin.Worker) {
		req.WorkerID, req.DPRank, req.HasDPRank, req.stored = pin.Worker, pin.Rank, true, true
		return nil
	}
	req.searching = true
	return nil
}

// registered reports whether the worker id is in the registry, routable
// or not.
func (s *Selector) registered(id uint64) bool {
	_, ok := s.reg.Get(id)
	return ok
}

// cacheHolder returns the worker that served most of keys (0: none).
func (rt *Routing) cacheHolder(keys []uint64) uint64 {
	var ids [8]uint64
	var hits [8]int
	n := 0
	for _, k := range keys {
		w, ok := rt.EmbedCache.Lookup(k)
		if !ok {
			continue
		}
		i := 0
		for i < n && ids[i] != w {
			i++
		}
		if i == n {
			if n == len(ids) {
				continue
			}
			ids[n] = w
			n++
		}
		hits[i]++
	}
	best := -1
	for i := 0; i < n; i++ {
		if best < 0 || hits[i] > hits[best] {
			best = i
		}
	}
	if best < 0 {
		return 0
	}
	return ids[best]
}

// pinFailed drops a hard pin whose worker cannot take the request (gone,
// not routable), so the error is given once and the next request of the
// session is pinned anew. A busy worker keeps its pin. A stored response's
// worker that cannot take the request, busy too, is named in the error.
func (s *Selector) pinFailed(rt *Routing, req *Request, err error) error {
	if err == nil || !(req.hard || req.stored) {
		return err
	}
	e, ok := err.(*Error) // selection's own errors; errors.As would cost an allocation per request
	switch {
	case !ok:
		return err
	case req.stored && e.Code == ResourceExhausted:
		return Errorf(ResourceExhausted, "response %s is stored on worker %d, which is busy",
			strconv.Quote(string(req.Response)), req.WorkerID)
	case req.stored: // the pin stays: the worker may come back with its responses
		return Errorf(e.Code, "response %s is stored on worker %d: %s",
			strconv.Quote(string(req.Response)), req.WorkerID, e.Msg)
	case e.Code == ResourceExhausted:
		return err
	}
	rt.Sessions.Drop(req.Session)
	return Errorf(e.Code, "session %s is pinned to worker %d: %s; the pin is dropped",
		strconv.Quote(string(req.Session)), req.WorkerID, e.Msg)
}

// Split says where SelectSplit put a split request.
type Split uint8

// The placements of a split request.
const (
	// SplitLegs: on a prefill and a decode worker, both reserved.
	SplitLegs Split = iota
	// SplitNoPrefill: whole on its decode worker, since no prefill worker
	// is routable, or every one is busy (Routing.PrefillFallback,
	// Routing.DecodePrefills).
	SplitNoPrefill
	// SplitOneWorker: whole on its decode worker, since the prefill pick
	// is that worker at the same rank (a worker of role both): a split
	// would only send the KV cache from the engine to itself.
	SplitOneWorker
	// SplitPrefillQueue: whole on its decode worker, since the prefill
	// pick's engine has Routing.MaxPrefillQueue requests waiting or more:
	// the decode engine prefills it sooner than the queue would.
	SplitPrefillQueue
	// SplitCached: whole on its decode worker, since that worker holds the
	// prompt's longest known prefix and what it lacks is shorter than
	// Routing.MinPrefillTokens (Routing.CachedSplits): the engine prefills
	// the rest sooner than a split would send it all.
	SplitCached
)

// SelectSplit routes and reserves both workers of a split (disaggregated)
// request on one snapshot: the decode worker as Select does, then the
// prefill worker (pre.Phase is PhasePrefill) among those holding the same
// adapter, preferring the session's prefill pin. While no prefill worker is
// routable (or, with Routing.DecodePrefills, every one is busy) and pre
// names none, the request runs whole on its decode worker if
// Routing.PrefillFallback is set (SplitNoPrefill); it runs whole there
// too when the prefill pick is the decode worker at the same rank
// (SplitOneWorker), whether picked or named, and when a prefill worker it
// picked has a queue of Routing.MaxPrefillQueue (SplitPrefillQueue). With
// Routing.CachedSplits it runs whole on its decode worker, without a
// prefill pick, when that worker holds enough of the prompt (dec's keys,
// of the decode key space), all but less than Routing.MinPrefillTokens
// (SplitCached). Only decRes is held then, and pre's prefix keys are
// recorded at its worker, whose engine prefills the prompt. On an error
// neither is held.
func (s *Selector) SelectSplit(dec, pre *Request, decRes, preRes *Reservation) (Split, error) {
	snap := s.reg.Snapshot()
	rt := s.routing.Load()
	var heldBy uint64 // the decode worker holding the prompt's longest known prefix, and its blocks
	var held int
	if rt.CachedSplits() && pre.WorkerID == 0 {
		heldBy, held = rt.Prefixes.Holder(dec.PrefixKeys)
	}
	if err := s.routeAndPick(rt, snap, dec, decRes); err != nil {
		return SplitLegs, err
	}
	if heldBy != 0 && decRes.Worker().ID() == heldBy && (dec.PromptBytes-held*rt.PrefixBlock)/4 < rt.MinPrefillTokens {
		return s.runWhole(rt, pre, preRes, decRes, SplitCached)
	}
	pre.group = dec.group
	if len(dec.Session) > 0 {
		pre.Session = append(append(pre.Session[:0], dec.Session...), prefillPin...)
		pre.SessionHint = dec.SessionHint
	}
	err := s.routeAndPick(rt, snap, pre, preRes)
	switch {
	case err == nil && preRes.Worker() == decRes.Worker() && preRes.Rank() == decRes.Rank():
		return s.runWhole(rt, pre, preRes, decRes, SplitOneWorker)
	case err == nil && rt.MaxPrefillQueue > 0 && pre.WorkerID == 0 && queueAtLeast(preRes.Worker(), rt.MaxPrefillQueue):
		return s.runWhole(rt, pre, preRes, decRes, SplitPrefillQueue)
	case err == nil:
		return SplitLegs, nil
	case (errors.Is(err, ErrNoEndpoints) || (rt.DecodePrefills && errors.Is(err, ErrResourceExhausted))) && pre.WorkerID == 0 && rt.PrefillFallback:
		return s.runWhole(rt, pre, preRes, decRes, SplitNoPrefill)
	}
	decRes.Release()
	return SplitLegs, err
}

// runWhole places a split request whole on its decode worker (decRes), as
// why says: its prefill pick, if it holds one, is let go, and its prompt's
// prefixes are recorded at the decode worker, whose engine prefills it.
func (s *Selector) runWhole(rt *Routing, pre *Request, preRes, decRes *Reservation, why Split) (Split, error) {
	preRes.Release()
	s.sentPrefix(rt, pre, decRes, nil)
	return why, nil
}

// queueAtLeast reports whether w's engine, at its last fresh reading,
// had n requests waiting or more.
func queueAtLeast(w *Worker, n int) bool {
	st := w.Engine()
	return st != nil && st.Waiting >= float64(n)
}

// Answered records where req went once its worker (res) answered: the
// session is pinned (again) to that worker and rank, and the worker now
// caches the embedding inputs.
func (s *Selector) Answered(req *Request, res *Reservation) {
	rt := s.routing.Load()
	w := res.Worker().ID()
	if len(req.Session) > 0 && rt.WantsSession() {
		rt.Sessions.Put(req.Session, affinity.Pin{Worker: w, Rank: res.Rank()})
	}
	if rt.EmbedCache != nil {
		for _, k := range req.CacheKeys {
			rt.EmbedCache.Record(k, w)
		}
	}
}

// Stored records that the worker res names holds the stored response id:
// it created it, or answered a request naming it with anything but a 404.
// Only a new id allocates.
func (s *Selector) Stored(id []byte, res *Reservation) {
	if rt := s.routing.Load(); rt.Responses != nil && len(id) > 0 && len(id) <= MaxResponseID {
		rt.Responses.Put(id, affinity.Pin{Worker: res.Worker().ID(), Rank: res.Rank()})
	}
}

// NotStored is told that req's worker answered 404 to a request naming a
// stored response it was known to hold (it restarted, or dropped it): the
// pin goes, and the next request naming the id searches for it.
func (s *Selector) NotStored(req *Request) {
	if req.stored {
		s.routing.Load().Responses.Drop(req.Response)
	}
}

// Unanswered is told that req's worker failed, as failure says ("failed
// before answering (connection refused)", say), and no other took the
// request. A hard-pinned session loses its pin, and the error to answer
// says so; nil when routing has nothing to add.
func (s *Selector) Unanswered(req *Request, worker uint64, failure string) error {
	if !req.hard {
		return nil
	}
	s.routing.Load().Sessions.Drop(req.Session)
	return Errorf(NoEndpoints,
		"session %s is pinned to worker %d, which %s; the pin is dropped and the next request is pinned anew",
		strconv.Quote(string(req.Session)), worker, failure)
}
