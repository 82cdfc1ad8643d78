package dataplane

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/internal/every"
	"github.com/fastroute/fastroute/lora"
	"github.com/fastroute/fastroute/pickers"
	"github.com/fastroute/fastroute/telemetry/engine"
	"github.com/puzpuzpuz/xsync/v3"
	"golang.org/x/sys/cpu"
)

// candidates is a set of workers a picker chooses from, as aligned slices.
// It implements pickers.State.
type candidates struct {
	ids     []uint64
	workers []*Worker
	occ     []*atomic.Int64
	weights pickers.WeightTable
	backups int // how many of the workers are backups (WorkerSpec.Backup)
}

// Len returns the number of candidates (of a snapshot: the routable workers).
func (c *candidates) Len() int { return len(c.ids) }

// Occupancy returns the live in-flight counters, aligned with the ids.
func (c *candidates) Occupancy() []*atomic.Int64 { return c.occ }

// Weights returns the telemetry weights, built for O(1) draws.
func (c *candidates) Weights() *pickers.WeightTable { return &c.weights }

func (c *candidates) reset() {
	c.ids, c.workers, c.occ, c.backups = c.ids[:0], c.workers[:0], c.occ[:0], 0
	c.weights.Reset()
}

func (c *candidates) add(w *Worker) {
	if w.spec.Backup {
		c.backups++
	}
	c.ids = append(c.ids, w.spec.ID)
	c.workers = append(c.workers, w)
	c.occ = append(c.occ, &w.occ.n)
	c.weights.Append(w.Weight())
}

// Cost prices candidate i from its engine's last reading and the live
// occupancy; false when the worker has no fresh reading or learned speed.
func (c *candidates) Cost(i int) (float64, bool) { return c.costWith(i, 0) }

// costWith prices candidate i as Cost does, with n more requests in
// flight.
func (c *candidates) costWith(i int, n int64) (float64, bool) {
	st := c.workers[i].engine.Load()
	if st == nil {
		return 0, false
	}
	return st.Cost(c.occ[i].Load() + n)
}

// ownCost prices candidate i as Cost does while its engine is priced at
// its own speed (learned, or told by its inter-token latency); false too
// while it is priced at a stand-in.
func (c *candidates) ownCost(i int) (float64, bool) {
	st := c.workers[i].engine.Load()
	if st == nil || st.Capacity() == 0 {
		return 0, false
	}
	return st.Cost(c.occ[i].Load())
}

// index returns the position of id, or -1. The search halves a window whose
// size does not depend on the data, so the compiler emits conditional moves
// instead of mispredicted branches.
func (c *candidates) index(id uint64) int {
	ids := c.ids
	n := len(ids)
	if n == 0 {
		return -1
	}
	base := 0
	for n > 1 {
		half := n >> 1
		if ids[base+half-1] < id {
			base += half
		}
		n -= half
	}
	if ids[base] == id {
		return base
	}
	return -1
}

// contains reports whether id is among the candidate ids.
func (c *candidates) contains(id uint64) bool { return c.index(id) >= 0 }

// groupLoad is a group's requests in flight; it outlives snapshots.
type groupLoad struct {
	_ cpu.CacheLinePad
	n atomic.Int64
	_ cpu.CacheLinePad
}

// Group is one group of a snapshot, the workers a request for one name may
// go to: a LoRA adapter's holders, with the adapter's requests in flight,
// or a base model's servers. Its routable members are sorted by id.
type Group struct {
	candidates
	name string
	load *groupLoad // nil for a base model's group
	// errNone and errBusy are its selection errors, made at their first
	// use: every request for a busy adapter meets the second while it
	// lasts, and a split request's prefill pick drops it.
	errNone, errBusy atomic.Pointer[Error]
}

// noneRoutable is the error of the group while none of its workers is
// routable.
func (g *Group) noneRoutable() *Error {
	return g.madeOnce(&g.errNone, NoEndpoints, "no routable worker holds %s")
}

// allBusy is the error of the group while every worker of it is busy.
func (g *Group) allBusy() *Error {
	return g.madeOnce(&g.errBusy, ResourceExhausted, "every worker holding %s is busy")
}

// madeOnce returns the error p holds, made from code and format (which
// names the group) at the first call; callers racing to make it each
// return one that reads the same.
func (g *Group) madeOnce(p *atomic.Pointer[Error], code Code, format string) *Error {
	if e := p.Load(); e != nil {
		return e
	}
	e := Errorf(code, format, g)
	p.Store(e)
	return e
}

// Name returns the group name.
func (g *Group) Name() string { return g.name }

// String names the group as errors do: adapter "name" or model "name".
func (g *Group) String() string {
	if g.load == nil {
		return "model " + strconv.Quote(g.name)
	}
	return "adapter " + strconv.Quote(g.name)
}

// Inflight returns the requests in flight routed by this group.
func (g *Group) Inflight() int64 { return g.load.n.Load() }

// Snapshot is an immutable view of the routable workers sorted by id,
// published through an atomic pointer so readers never lock. It also holds
// the catalog of the adapters and base models of all registered workers,
// one group per adapter, and one per base model that not every routable
// worker serves.
type Snapshot struct {
	candidates
	// gpus and cpus split the routable workers by device when both kinds
	// are present (else both are empty), for the CPU overflow rule.
	gpus, cpus candidates
	// prefill and decode are the pools of a disaggregated request: the
	// workers whose role serves the phase.
	prefill, decode candidates
	catalog         lora.Catalog
	groups          []*Group // by adapter number in the catalog
	// models are the base models' groups by number in the catalog: the
	// routable workers that list the model, and those that list none yet
	// (they may serve it). Nil where that is every routable worker.
	models []*Group
}

// pool returns the candidates of a phase.
func (s *Snapshot) pool(p Phase) *candidates {
	switch p {
	case PhasePrefill:
		return &s.prefill
	case PhaseDecode:
		return &s.decode
	}
	return &s.candidates
}

// Group returns the named adapter's group, or nil. The lookup does not
// allocate.
func (s *Snapshot) Group(name []byte) *Group {
	if i, ok := s.catalog.Adapter(name); ok {
		return s.groups[i]
	}
	return nil
}

// ModelGroup returns the group of the workers serving the named base
// model, or nil when the model is not listed or every routable worker may
// serve it. The lookup does not allocate.
func (s *Snapshot) ModelGroup(name []byte) *Group {
	if i, ok := s.catalog.Model(name); ok {
		return s.models[i]
	}
	return nil
}

// Serves reports whether a routable worker of the snapshot would take a
// request for model: an adapter's holder, a base model's server (any
// routable worker while no worker lists its base models, or when every
// worker serves it).
func (s *Snapshot) Serves(model []byte) bool {
	i, err := s.catalog.Resolve(model)
	switch {
	case err != nil:
		return false
	case i >= 0:
		return s.groups[i].Len() > 0
	}
	if g := s.ModelGroup(model); g != nil {
		return g.Len() > 0
	}
	return s.Len() > 0
}

// Lists reports whether a routable worker of the snapshot names model:
// holds it as an adapter, or lists it among its base models. Unlike
// Serves, never for a model no worker names.
func (s *Snapshot) Lists(model []byte) bool {
	_, adapter := s.catalog.Adapter(model)
	return (adapter || s.catalog.HasModel(model)) && s.Serves(model)
}

// Groups returns every adapter's group (do not modify).
func (s *Snapshot) Groups() []*Group { return s.groups }

// Catalog returns the adapters and base models of the registered workers.
func (s *Snapshot) Catalog() *lora.Catalog { return &s.catalog }

// Has reports whether worker id is routable in the snapshot.
func (s *Snapshot) Has(id uint64) bool { return s.index(id) >= 0 }

// IDs returns the sorted routable worker ids (do not modify).
func (s *Snapshot) IDs() []uint64 { return s.ids }

// Workers returns the routable workers aligned with IDs (do not modify).
func (s *Snapshot) Workers() []*Worker { return s.workers }

// Registry holds every registered worker. Writes (register, drain, health and
// weight changes) serialise on a mutex and publish a new Snapshot; the request
// path only loads the snapshot and reads atomics.
type Registry struct {
	mu      sync.Mutex // writers only
	workers *xsync.MapOf[uint64, *Worker]
	snap    atomic.Pointer[Snapshot]
	subs    atomic.Pointer[[]func(*Worker, Change)] // copied on Subscribe
	loads   *xsync.MapOf[string, *groupLoad]        // per-group in-flight, across snapshots
	eject   atomic.Pointer[EjectPolicy]
	ejected atomic.Uint64 // ejections since start
	// down holds the ids put down by hand (SetDown, SetDownIDs), whether
	// registered now or not (a worker found on etcd that joins after a
	// restart): a worker of such an id joins down. Under mu.
	down map[uint64]bool
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{workers: xsync.NewMapOf[uint64, *Worker](), loads: xsync.NewMapOf[string, *groupLoad](), down: map[uint64]bool{}}
	r.snap.Store(&Snapshot{})
	return r
}

// Change is what happened to a worker, for the registry's subscribers.
type Change uint8

// The changes.
const (
	// Joined: the worker was registered (added, or the new spec of a
	// replaced one); it is routable once healthy.
	Joined Change = iota + 1
	// Left: the worker stopped being routable (drained, unhealthy,
	// ejected, asleep, stalled); it may come back.
	Left
	// Replaced: a new spec took the worker's id (a reload, discovery); this
	// worker object is retired once its requests end.
	Replaced
	// Removed: the worker is gone from the registry (swept once drained
	// and idle).
	Removed
)

// Subscribe adds fn to the functions told of every worker change. They run
// in the goroutine that made the change (an admin call, the health loop,
// the sweep, an answer that ejects), outside the registry's lock, so they
// must be quick and may call the registry.
func (r *Registry) Subscribe(fn func(w *Worker, c Change)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var subs []func(*Worker, Change)
	if old := r.subs.Load(); old != nil {
		subs = append(subs, *old...)
	}
	subs = append(subs, fn)
	r.subs.Store(&subs)
}

// notify tells the subscribers of a change.
func (r *Registry) notify(w *Worker, c Change) {
	if subs := r.subs.Load(); subs != nil {
		for _, fn := range *subs {
			fn(w, c)
		}
	}
}

// Run sweeps drained workers every period (a reload may change it) until
// ctx ends.
func (r *Registry) Run(ctx context.Context, period *every.Period) {
	period.Tick(ctx, func() { r.SweepDrained() })
}

// Snapshot returns the current routable view. It never blocks.
func (r *Registry) Snapshot() *Snapshot { return r.snap.Load() }

// Get returns a registered worker, routable or not.
func (r *Registry) Get(id uint64) (*Worker, bool) { return r.workers.Load(id) }

// All returns every registered worker sorted by id.
func (r *Registry) All() []*Worker {
	out := make([]*Worker, 0, r.workers.Size())
	r.workers.Range(func(_ uint64, w *Worker) bool {
		out = append(out, w)
		return true
	})
	slices.SortFunc(out, func(a, b *Worker) int {
		switch {
		case a.spec.ID < b.spec.ID:
			return -1
		case a.spec.ID > b.spec.ID:
			return 1
		}
		return 0
	})
	return out
}

// Add registers a worker, routable at once (the workers a router starts
// with). The spec is normalised; a duplicate id is refused.
func (r *Registry) Add(spec WorkerSpec) (*Worker, error) { return r.add(spec, true) }

// AddUnprobed registers a worker that becomes routable only once a health
// probe passes (workers added while running: admin API, reload).
func (r *Registry) AddUnprobed(spec WorkerSpec) (*Worker, error) { return r.add(spec, false) }

func (r *Registry) add(spec WorkerSpec, healthy bool) (*Worker, error) {
	if err := spec.Normalize(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	w := newWorker(spec)
	w.healthy.Store(healthy)
	w.down.Store(r.down[spec.ID])
	r.priceUnread(w)
	if _, loaded := r.workers.LoadOrStore(spec.ID, w); loaded {
		r.mu.Unlock()
		return nil, &DuplicateError{ID: spec.ID}
	}
	r.publishLocked()
	r.mu.Unlock()
	r.notify(w, Joined)
	return w, nil
}

// Replace swaps a registered worker's spec for a new one (a config reload
// that changed it) and returns the old worker: new requests see the new one
// at once; requests in flight finish on the old one and release there. At
// the same URL the two share their counts (and their ranks' at the same
// dp_size): the old requests run on the same engine, and count against
// the new one's cap, in GET /workers and in the picks until they end; and
// the engine's last reading prices the new one until the next. At another
// URL the new one counts only what it was given, priced as one joining,
// and stays in rotation on probation (Worker.OnProbation): its first
// failed probe takes it out, where others need unhealthy_after (the caller
// probes it at once).
func (r *Registry) Replace(spec WorkerSpec) (old *Worker, err error) {
	if err := spec.Normalize(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	old, ok := r.workers.Load(spec.ID)
	if !ok {
		r.mu.Unlock()
		return nil, Errorf(NotFound, "unknown worker id %d", spec.ID)
	}
	w := r.replaceLocked(old, spec)
	r.mu.Unlock()
	r.notify(old, Replaced)
	r.notify(w, Joined)
	return old, nil
}

// Update changes worker id's spec by change (the admin API's PATCH of its
// routing settings: its cap, capacity, backup, context, role), checked as
// any spec is, and replaces the worker with it (Replace, at the same URL:
// its counts carry over) when that changed anything. change must leave
// the id and the URL. A worker being drained is refused (DrainingError).
func (r *Registry) Update(id uint64, change func(*WorkerSpec)) (changed bool, err error) {
	r.mu.Lock()
	old, err := r.changeableLocked(id)
	if err != nil {
		r.mu.Unlock()
		return false, err
	}
	spec := old.spec
	spec.LoRAs, spec.Models = slices.Clone(spec.LoRAs), slices.Clone(spec.Models)
	change(&spec)
	if err := spec.Normalize(); err != nil {
		r.mu.Unlock()
		return false, Errorf(InvalidArgument, "%v", err)
	}
	if reflect.DeepEqual(spec, old.spec) {
		r.mu.Unlock()
		return false, nil
	}
	w := r.replaceLocked(old, spec)
	r.mu.Unlock()
	r.notify(old, Replaced)
	r.notify(w, Joined)
	return true, nil
}

// changeableLocked returns worker id for the admin API to change: an
// error for an unknown id (NotFound) and for a worker being drained
// (DrainingError). The caller holds mu.
func (r *Registry) changeableLocked(id uint64) (*Worker, error) {
	w, ok := r.workers.Load(id)
	switch {
	case !ok:
		return nil, Errorf(NotFound, "unknown worker id %d", id)
	case w.Draining():
		return nil, &DrainingError{ID: id}
	}
	return w, nil
}

// replaceLocked puts a worker of spec (normalised) in old's place, with
// old's live state, and publishes. The caller holds mu.
func (r *Registry) replaceLocked(old *Worker, spec WorkerSpec) *Worker {
	w := newWorker(spec)
	if spec.URL == old.spec.URL {
		// The same engine: its requests in flight, and its last reading
		// until the next scrape.
		w.occ = old.occ
		if spec.DPSize == old.spec.DPSize {
			w.ranks = old.ranks
		}
		w.engine.Store(old.engine.Load())
		w.countsTokens.Store(old.countsTokens.Load())
		w.probation.Store(old.OnProbation()) // not judged yet either
	} else {
		r.priceUnread(w)
		w.probation.Store(true)
	}
	w.healthy.Store(old.Healthy())
	w.down.Store(old.Down())
	w.asleep.Store(old.Asleep())
	w.stalled.Store(old.Stalled())
	w.adv.Store(old.adv.Load())
	w.declared.Store(old.declared.Load())
	r.workers.Store(spec.ID, w)
	r.publishLocked()
	return w
}

// EjectPolicy is the passive health check, after Envoy's outlier
// detection: After consecutive 5xx answers or transport failures take a
// worker out of rotation for Base, doubled at each further ejection without
// a good answer between, up to Max.
type EjectPolicy struct {
	After     int // 0: never eject
	Base, Max time.Duration
}

// SetEjectPolicy sets the passive health check.
func (r *Registry) SetEjectPolicy(p EjectPolicy) { r.eject.Store(&p) }

// ReportAnswer records how a dispatch to w ended (ok: an answer below
// 500). It returns the ejection time when this failure ejected w. A good
// answer costs two atomic loads.
func (r *Registry) ReportAnswer(w *Worker, ok bool) (ejectedFor time.Duration) {
	if ok {
		if w.failStreak.Load() != 0 {
			w.failStreak.Store(0)
		}
		if w.ejections.Load() != 0 {
			w.ejections.Store(0)
		}
		return 0
	}
	p := r.eject.Load()
	if p == nil || p.After <= 0 || int(w.failStreak.Add(1)) < p.After || w.ejectedUntil.Load() != 0 {
		return 0
	}
	if r.snap.Load().Len() <= 1 {
		return 0 // never eject the last routable worker: a failing answer beats none
	}
	n := min(w.ejections.Add(1), 20)
	d := min(p.Base<<(n-1), p.Max)
	if !w.ejectedUntil.CompareAndSwap(0, time.Now().Add(d).UnixNano()) {
		return 0
	}
	w.failStreak.Store(0)
	r.ejected.Add(1)
	r.Republish()
	r.notify(w, Left)
	return d
}

// Readmit returns to rotation the ejected workers whose time is up at now,
// and lists them.
func (r *Registry) Readmit(now time.Time) (back []uint64) {
	r.workers.Range(func(id uint64, w *Worker) bool {
		if u := w.ejectedUntil.Load(); u != 0 && now.UnixNano() >= u && w.ejectedUntil.CompareAndSwap(u, 0) {
			back = append(back, id)
		}
		return true
	})
	if len(back) > 0 {
		r.Republish()
	}
	return back
}

// Uneject returns a worker to rotation at once and forgets its failures:
// it came back (its probes failed, then passed), so what it did before says
// little now.
func (r *Registry) Uneject(id uint64) {
	w, ok := r.workers.Load(id)
	if !ok {
		return
	}
	w.failStreak.Store(0)
	w.ejections.Store(0)
	if w.ejectedUntil.Swap(0) != 0 {
		r.Republish()
	}
}

// Ejections returns how many times a worker was ejected since start.
func (r *Registry) Ejections() uint64 { return r.ejected.Load() }

// Drain stops new requests to a worker; requests in flight finish. The worker
// is removed by SweepDrained once idle.
func (r *Registry) Drain(id uint64) error {
	w, ok := r.workers.Load(id)
	if !ok {
		return Errorf(NotFound, "unknown worker id %d", id)
	}
	if w.draining.Swap(true) {
		return nil
	}
	r.mu.Lock()
	r.publishLocked()
	r.mu.Unlock()
	r.notify(w, Left)
	return nil
}

// SetDown puts worker id out of rotation by hand (down), or back (!down),
// and says whether that changed it: as HAProxy's maintenance state and
// NGINX Plus's down, a worker put down takes no new request (nor one that
// names it) while its requests in flight finish, its health probes and
// engine readings go on, and it keeps its place, counts and learned
// engine speed for when it is put back. Sessions placed on it are placed
// again (Left). A worker being drained is refused (DrainingError).
func (r *Registry) SetDown(id uint64, down bool) (changed bool, err error) {
	return r.setDown(id, down, false)
}

// setDown is SetDown; with pending, an id not registered is kept down, or
// no longer, for when it joins.
func (r *Registry) setDown(id uint64, down, pending bool) (changed bool, err error) {
	r.mu.Lock()
	w, err := r.changeableLocked(id)
	unregistered := pending && errors.Is(err, ErrNotFound)
	if !unregistered && (err != nil || w.down.Swap(down) == down) {
		r.mu.Unlock()
		return false, err
	}
	if down {
		r.down[id] = true
	} else {
		delete(r.down, id)
	}
	if unregistered { // kept for when it joins
		r.mu.Unlock()
		return false, nil
	}
	r.publishLocked()
	r.mu.Unlock()
	if down {
		r.notify(w, Left)
	}
	return true, nil
}

// SetDownIDs puts the workers of ids down (a restart's state_file): those
// registered now at once, the others as they join.
func (r *Registry) SetDownIDs(ids []uint64) {
	for _, id := range ids {
		r.SetDownID(id, true)
	}
}

// SetDownID puts worker id down or back (SetDown), and an id not
// registered yet joins so (a down mark on etcd may come before its
// worker). A worker being drained is left as it is.
func (r *Registry) SetDownID(id uint64, down bool) {
	_, _ = r.setDown(id, down, true)
}

// DownIDs returns the ids put down by hand, registered or not, in order.
func (r *Registry) DownIDs() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.down))
}

// SweepDrained removes draining workers that have no request in flight,
// tells the subscribers (Removed) and returns them. Run calls it.
func (r *Registry) SweepDrained() []*Worker {
	var gone []*Worker
	r.workers.Range(func(_ uint64, w *Worker) bool {
		if w.Draining() && w.Occupancy() == 0 {
			gone = append(gone, w)
		}
		return true
	})
	removed := gone[:0]
	for _, w := range gone {
		deleted := false
		r.workers.Compute(w.spec.ID, func(cur *Worker, loaded bool) (*Worker, bool) {
			deleted = loaded && cur == w // not one a Replace put there meanwhile
			return cur, deleted
		})
		if deleted {
			r.mu.Lock()
			delete(r.down, w.spec.ID) // an id added again joins in rotation
			r.mu.Unlock()
			removed = append(removed, w)
			r.notify(w, Removed)
		}
	}
	return removed
}

// SetAdapters replaces the adapters declared for worker id (admin API; the
// spec's until then) and republishes, so new requests see the change at
// once.
func (r *Registry) SetAdapters(id uint64, adapters []string) error {
	w, ok := r.workers.Load(id)
	if !ok {
		return Errorf(NotFound, "unknown worker id %d", id)
	}
	if err := checkNames("loras", "adapter", adapters); err != nil {
		return Errorf(InvalidArgument, "%v", err)
	}
	declared := slices.Clone(adapters)
	w.declared.Store(&declared)
	r.Republish()
	return nil
}

// SetHealthy records a health verdict and republishes on a change.
func (r *Registry) SetHealthy(id uint64, healthy bool) {
	w, ok := r.workers.Load(id)
	if !ok {
		return
	}
	w.probation.Store(false) // a probe judged it
	if w.healthy.Swap(healthy) == healthy {
		return
	}
	r.mu.Lock()
	r.publishLocked()
	r.mu.Unlock()
	if !healthy {
		r.notify(w, Left)
	}
}

// SetEngine stores worker id's latest engine reading (nil: none fresh) and
// republishes when the worker's routing changed (Worker.SetEngine); a
// worker whose engine fell asleep or stalled has Left, like one found
// unhealthy. A reading without a learned speed is priced at a stand-in
// capacity (standIn), so that one engine the router is still learning
// (one that just joined) does not leave every engine unpriced; one whose
// batch size is not known yet (the router's own reading of an engine
// without metrics among them) is priced for the batch size batchOf gives
// it.
func (r *Registry) SetEngine(id uint64, st *engine.Stats) {
	w, ok := r.workers.Load(id)
	if !ok {
		return
	}
	switch {
	case st == nil:
	case st.Capacity() == 0:
		cp := *st
		cp.StandIn = r.standIn(w, st)
		st = &cp
	case st.Admit == 0:
		// The batch size is not known: the most requests the engine was
		// seen running at once (the router's own reading: had in flight
		// there) is no batch size, only a bound below it.
		cp := *st
		_, cp.Slots = r.batchOf(w, st)
		st = &cp
	}
	if !w.SetEngine(st) {
		return
	}
	r.Republish()
	if w.Asleep() || w.Stalled() {
		r.notify(w, Left)
	}
}

// standIn is the capacity worker w's engine, whose speed is not learned,
// is priced at: the mean learned speed per running request of the other
// routable workers' engines, times a batch size. An engine that reports
// its load and a token counter or an inter-token latency histogram (its
// speed then known a scrape after its first tokens, or a second of them)
// is priced as a probe: for probeBatch requests (fewer where batchOf gives
// fewer), or the most it was seen running if more (its own batch once
// seen queueing), so that it takes a request or two once the others are
// half busy and is priced at its own speed soon after. Priced for the
// others' batch (batchOf), a CPU engine that joined a GPU fleet was fed as
// a GPU until then, and queued requests past the timeout. The others'
// batch stays for the router's own reading of an engine without metrics
// (its running count is the router's in flight there, which a probe would
// bound by what the router sent it) and for an engine that tells neither
// counter (a probe for good). 0 when no other engine has a learned speed.
func (r *Registry) standIn(w *Worker, st *engine.Stats) float64 {
	rate, batch := r.batchOf(w, st)
	if st.Dialect != engine.DialectRouter && (st.Tokens >= 0 || st.TokenGaps >= 0) {
		batch = max(st.Slots, min(batch, probeBatch))
	}
	return rate * batch
}

// probeBatch is the batch size an engine of unknown speed is priced for
// until it is seen running more (standIn): a request or two, whose tokens
// tell its speed.
const probeBatch = 2

// batchOf returns the mean learned speed of the others of w's kind
// (meanSpeed; of every other while its speed is not learned: the
// stand-in's case) and the batch size w's engine is priced for: its own
// once known (Admit, or a queue behind its running requests), else the
// larger of the most requests it was seen running and the mean batch size
// of the others of its kind. Those are the engines of a learned speed
// within a factor of kindSpeedRatio of its own (a CPU engine beside GPU
// ones says nothing of their batch, nor they of its), or every other
// while its speed is not learned. The most seen running is a bound below
// the batch, and alone it priced engines alike apart by the chance of
// their busiest moment (three engines of 16 slots, run below their batch
// in a benchmark, were priced for 16, 11 and 15) and fed them unevenly.
func (r *Registry) batchOf(w *Worker, st *engine.Stats) (rate, batch float64) {
	rate, slots := r.meanSpeed(w, st.TokenRate) // one pass over the workers, at each such reading
	batch = st.Slots
	if st.Admit == 0 && st.Waiting == 0 {
		batch = max(batch, slots)
	}
	return rate, batch
}

// kindSpeedRatio bounds how far apart two engines' learned speeds per
// running request may be for one's batch size to stand for the other's
// (batchOf). An engine's own speed moves by about a third between an
// empty and a full batch.
const kindSpeedRatio = 2

// meanSpeed returns the mean learned speed per running request and the
// mean batch size of the routable workers but w whose engines have a
// learned speed, within kindSpeedRatio of like when like is not 0: of
// those serving a base model w serves, where any does (engines of
// different models run at different speeds, and requests for w's model
// compare it with those), else of all; zeros when none has.
func (r *Registry) meanSpeed(w *Worker, like float64) (rate, slots float64) {
	mine := w.Models()
	var peers, all speedSum
	for _, o := range r.snap.Load().workers {
		if o == w {
			continue
		}
		st := o.engine.Load()
		if st == nil || st.Capacity() == 0 || (like > 0 && (st.TokenRate > like*kindSpeedRatio || st.TokenRate*kindSpeedRatio < like)) {
			continue
		}
		all.add(st)
		if len(mine) > 0 && slices.ContainsFunc(o.Models(), func(m string) bool { return slices.Contains(mine, m) }) {
			peers.add(st)
		}
	}
	if peers.n > 0 {
		return peers.mean()
	}
	return all.mean()
}

// speedSum adds up engines' learned speeds and batch sizes.
type speedSum struct {
	rate, slots float64
	n           int
}

func (s *speedSum) add(st *engine.Stats) {
	s.rate, s.slots, s.n = s.rate+st.TokenRate, s.slots+st.Slots, s.n+1
}

// mean returns the mean speed and batch size, zeros for none.
func (s speedSum) mean() (rate, slots float64) {
	if s.n == 0 {
		return 0, 0
	}
	return s.rate / float64(s.n), s.slots / float64(s.n)
}

// priceUnread prices a worker joining a fleet whose engines are priced,
// until its engine's first reading: as one request's slot at the others'
// mean speed, so that it takes a request while the others' costs are
// above that (its first, or whenever they queue) but is not sent every
// request while it shows none in flight, as the router's own signals
// would send them to an engine they know nothing of. Its first reading
// replaces it; a scrape that fails before any reading withdraws it.
func (r *Registry) priceUnread(w *Worker) {
	if rate, _ := r.meanSpeed(w, 0); rate > 0 {
		w.SetEngine(&engine.Stats{Slots: 1, StandIn: rate, PrefixHitRatio: -1})
	}
}

// Republish builds a new snapshot, picking up weights set with SetWeight.
// The telemetry loop calls it once per refresh.
func (r *Registry) Republish() {
	r.mu.Lock()
	r.publishLocked()
	r.mu.Unlock()
}

// groupModels fills the base models' groups once every model is in the
// catalog: a routable worker joins those of the models it serves (declared
// or listed, serves[i] for s.workers[i]), or every one while it names
// none. A group that holds every routable worker restricts nothing and is
// dropped (nil): a fleet serving one model picks as if no model were
// named.
func (s *Snapshot) groupModels(served [][]string) {
	if len(s.models) == 0 {
		return
	}
	for i, w := range s.workers {
		serves := served[i]
		for _, g := range s.models {
			if len(serves) == 0 || slices.Contains(serves, g.name) {
				g.add(w)
			}
		}
	}
	for i, g := range s.models {
		if g.Len() == s.Len() {
			s.models[i] = nil
		} else {
			g.weights.Build()
		}
	}
}

// GroupLoads calls fn with every group's requests in flight, including
// groups no worker holds any more.
func (r *Registry) GroupLoads(fn func(name string, inflight int64)) {
	r.loads.Range(func(name string, l *groupLoad) bool {
		fn(name, l.n.Load())
		return true
	})
}

func (r *Registry) publishLocked() {
	all := r.All()
	s := &Snapshot{}
	var served [][]string // each routable worker's base models, as s.workers
	for _, w := range all {
		routable := w.Routable()
		if routable {
			s.add(w)
			if w.spec.Device == DeviceGPU {
				s.gpus.add(w)
			} else {
				s.cpus.add(w)
			}
			if w.spec.Role.serves(PhasePrefill) {
				s.prefill.add(w)
			}
			if w.spec.Role.serves(PhaseDecode) {
				s.decode.add(w)
			}
		}
		models := w.Models()
		if routable {
			served = append(served, models)
		}
		for _, m := range models {
			if s.catalog.AddModel(m) == len(s.models) {
				s.models = append(s.models, &Group{name: m})
			}
		}
		for _, name := range w.Adapters() {
			i := s.catalog.AddAdapter(name)
			if i == len(s.groups) {
				load, _ := r.loads.LoadOrCompute(name, func() *groupLoad { return &groupLoad{} })
				s.groups = append(s.groups, &Group{name: name, load: load})
			}
			if routable {
				s.groups[i].add(w)
			}
		}
	}
	s.groupModels(served)
	s.weights.Build()
	if len(s.gpus.ids) == 0 || len(s.cpus.ids) == 0 {
		s.gpus, s.cpus = candidates{}, candidates{}
	}
	s.gpus.weights.Build()
	s.prefill.weights.Build()
	s.decode.weights.Build()
	for _, g := range s.groups {
		g.weights.Build()
	}
	r.snap.Store(s)
}
