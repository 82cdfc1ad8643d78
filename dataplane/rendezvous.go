package dataplane

import "math"

// Rendezvous returns the worker of the phase's pool (or of group g, when
// not nil) that key maps to by weighted rendezvous hashing (highest random
// weight, weighted by capacity): every router that sees the same workers
// picks the same one without talking to the others, and when a worker
// leaves only its own keys move. ok is false for an empty set. It does not
// allocate.
func (s *Snapshot) Rendezvous(key uint64, p Phase, g *Group) (id uint64, ok bool) {
	c := s.pool(p)
	if g != nil {
		c = &g.candidates
	}
	best := math.Inf(-1)
	for i, w := range c.workers {
		if p != PhaseAny && !w.spec.Role.serves(p) {
			continue // a group's member outside the phase's pool
		}
		// A uniform draw in (0, 1) from the key and the worker; the score
		// −capacity / ln(u) gives each worker a share of keys in
		// proportion to its capacity.
		u := (float64(mix64(key^mix64(c.ids[i]))>>11) + 0.5) / (1 << 53)
		if score := -w.spec.Capacity / math.Log(u); score > best {
			best, id, ok = score, c.ids[i], true
		}
	}
	return id, ok
}

// mix64 is SplitMix64's finalizer: every input bit moves every output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
