package dataplane

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/fastroute/fastroute/pickers"
	"github.com/puzpuzpuz/xsync/v3"
)

// candidates is a set of workers a picker chooses from, as aligned slices.
// It implements pickers.State.
type candidates struct {
	ids     []uint64
	workers []*Worker
	occ     []*atomic.Int64
	weights pickers.WeightTable
}

// Occupancy returns the live in-flight counters, aligned with the ids.
func (c *candidates) Occupancy() []*atomic.Int64 { return c.occ }

// Weights returns the telemetry weights, built for O(1) draws.
func (c *candidates) Weights() *pickers.WeightTable { return &c.weights }

func (c *candidates) reset() {
	c.ids, c.workers, c.occ = c.ids[:0], c.workers[:0], c.occ[:0]
	c.weights.Reset()
}

func (c *candidates) add(w *Worker) {
	c.ids = append(c.ids, w.spec.ID)
	c.workers = append(c.workers, w)
	c.occ = append(c.occ, &w.occ.n)
	c.weights.Append(w.Weight())
}

// Snapshot is an immutable view of the routable workers sorted by id,
// published through an atomic pointer so readers never lock.
type Snapshot struct {
	candidates
	version uint64
}

// IDs returns the sorted routable worker ids (do not modify).
func (s *Snapshot) IDs() []uint64 { return s.ids }

// Workers returns the routable workers aligned with IDs (do not modify).
func (s *Snapshot) Workers() []*Worker { return s.workers }

// Len returns the number of routable workers.
func (s *Snapshot) Len() int { return len(s.ids) }

// Version increases with every publication.
func (s *Snapshot) Version() uint64 { return s.version }

// index returns the position of id, or -1.
func (s *Snapshot) index(id uint64) int {
	if i, ok := slices.BinarySearch(s.ids, id); ok {
		return i
	}
	return -1
}

// Registry holds every registered worker. Writes (register, drain, health and
// weight changes) serialise on a mutex and publish a new Snapshot; the request
// path only loads the snapshot and reads atomics.
type Registry struct {
	mu      sync.Mutex // writers only
	workers *xsync.MapOf[uint64, *Worker]
	snap    atomic.Pointer[Snapshot]
	onLeave atomic.Pointer[func(id uint64)]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{workers: xsync.NewMapOf[uint64, *Worker]()}
	r.snap.Store(&Snapshot{})
	return r
}

// OnLeave sets a hook called (off the request path) whenever a worker stops
// being routable or is removed, so affinity pins can be dropped.
func (r *Registry) OnLeave(fn func(id uint64)) { r.onLeave.Store(&fn) }

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

// Add registers a worker. The spec is normalised; a duplicate id is refused.
func (r *Registry) Add(spec WorkerSpec) (*Worker, error) {
	if err := spec.Normalize(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := newWorker(spec)
	if _, loaded := r.workers.LoadOrStore(spec.ID, w); loaded {
		return nil, fmt.Errorf("worker %d is already registered", spec.ID)
	}
	r.publishLocked()
	return w, nil
}

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
	r.left(id)
	return nil
}

// SweepDrained removes draining workers that have no request in flight and
// returns them, so callers can drop what they keep per worker.
func (r *Registry) SweepDrained() []*Worker {
	var gone []*Worker
	r.workers.Range(func(_ uint64, w *Worker) bool {
		if w.Draining() && w.Occupancy() == 0 {
			gone = append(gone, w)
		}
		return true
	})
	for _, w := range gone {
		r.workers.Delete(w.spec.ID)
	}
	return gone
}

// SetHealthy records a health verdict and republishes on a change.
func (r *Registry) SetHealthy(id uint64, healthy bool) {
	w, ok := r.workers.Load(id)
	if !ok || w.healthy.Swap(healthy) == healthy {
		return
	}
	r.mu.Lock()
	r.publishLocked()
	r.mu.Unlock()
	if !healthy {
		r.left(id)
	}
}

// Republish builds a new snapshot, picking up weights set with SetWeight.
// The telemetry loop calls it once per refresh.
func (r *Registry) Republish() {
	r.mu.Lock()
	r.publishLocked()
	r.mu.Unlock()
}

func (r *Registry) left(id uint64) {
	if fn := r.onLeave.Load(); fn != nil {
		(*fn)(id)
	}
}

func (r *Registry) publishLocked() {
	all := r.All()
	s := &Snapshot{version: r.snap.Load().version + 1}
	for _, w := range all {
		if w.Routable() {
			s.add(w)
		}
	}
	s.weights.Build()
	r.snap.Store(s)
}
