package dataplane

import "sync/atomic"

// Reservation is one in-flight slot on a worker. It is released exactly once:
// a second Release is a no-op. A Reservation is reused in place (requests keep
// one in pooled state) and must not be copied while held.
type Reservation struct {
	worker *Worker
	rank   int
	held   atomic.Bool
}

// Worker returns the reserved worker (nil before the first reservation).
func (r *Reservation) Worker() *Worker { return r.worker }

// Rank returns the data-parallel rank chosen for the request.
func (r *Reservation) Rank() int { return r.rank }

// Held reports whether the slot is still taken.
func (r *Reservation) Held() bool { return r.held.Load() }

// Release frees the slot. It reports true only for the call that freed it.
func (r *Reservation) Release() bool {
	if !r.held.CompareAndSwap(true, false) {
		return false
	}
	r.worker.occ.n.Add(-1)
	return true
}

func (r *Reservation) hold(w *Worker, rank int) {
	r.worker, r.rank = w, rank
	r.held.Store(true)
}
