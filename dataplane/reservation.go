package dataplane

import "sync/atomic"

// Reservation is one in-flight slot on a worker. It is released exactly once:
// a second Release is a no-op. A Reservation is reused in place (requests keep
// one in pooled state) and must not be copied while held.
type Reservation struct {
	worker *Worker
	group  *Group // the LoRA group whose in-flight count it also holds; may be nil
	rank   int
	held   atomic.Bool
}

// Worker returns the reserved worker (nil before the first reservation).
func (r *Reservation) Worker() *Worker { return r.worker }

// Rank returns the data-parallel rank chosen for the request.
func (r *Reservation) Rank() int { return r.rank }

// Group returns the group (LoRA adapter) the request was routed by, or nil.
func (r *Reservation) Group() *Group { return r.group }

// Dispatched counts the request as sent to the reserved worker (Served);
// a query-only pick is reserved but never dispatched.
func (r *Reservation) Dispatched() { r.worker.occ.served.Add(1) }

// Held reports whether the slot is still taken.
func (r *Reservation) Held() bool { return r.held.Load() }

// Release frees the slot. It reports true only for the call that freed it.
func (r *Reservation) Release() bool {
	if !r.held.CompareAndSwap(true, false) {
		return false
	}
	if ranks := r.worker.ranks; len(ranks) > 0 { // before the worker's count, which is never below a rank's
		ranks[r.rank].Add(-1)
	}
	r.worker.occ.n.Add(-1)
	if r.group != nil {
		r.group.load.n.Add(-1)
	}
	return true
}

// hold takes the slot on w; a LoRA group g counts the request too (a base
// model's group keeps no count).
func (r *Reservation) hold(w *Worker, g *Group, rank int) {
	if g != nil && g.load == nil {
		g = nil
	}
	r.worker, r.group, r.rank = w, g, rank
	if len(w.ranks) > 0 {
		w.ranks[rank].Add(1)
	}
	if g != nil {
		g.load.n.Add(1)
	}
	r.held.Store(true)
}
