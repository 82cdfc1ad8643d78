package affinity

import (
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/puzpuzpuz/xsync/v3"
)

// Cache records which worker last served each embedding input, so a request
// repeating inputs can go where their embeddings (and prefix cache) are warm.
// Keys are xxhash values of the input strings. The size is bounded by a CLOCK
// ring: a lookup hit sets the key's reference bit; storing a new key advances
// the hand past referenced slots (clearing their bit, a second chance) and
// evicts the first unreferenced one.
type Cache struct {
	m      *xsync.MapOf[uint64, cached]
	ring   []clockSlot
	hand   atomic.Uint64
	hits   atomic.Uint64
	misses atomic.Uint64
}

type cached struct {
	worker uint64
	slot   uint32
}

type clockSlot struct {
	key atomic.Uint64
	ref atomic.Bool
}

// NewCache returns a cache of at most size keys.
func NewCache(size int) *Cache {
	if size <= 0 {
		size = 1 << 16
	}
	return &Cache{m: xsync.NewMapOfWithHasher[uint64, cached](rehash), ring: make([]clockSlot, size)}
}

// Key hashes one embedding input or session id; 0 is never returned.
func Key(input []byte) uint64 {
	if h := xxhash.Sum64(input); h != 0 {
		return h
	}
	return 1 // 0 marks an empty slot
}

// Lookup returns the worker that last served key, counting a hit or a miss.
// It does not allocate.
func (c *Cache) Lookup(key uint64) (worker uint64, ok bool) {
	e, ok := c.m.Load(key)
	if !ok {
		c.misses.Add(1)
		return 0, false
	}
	c.hits.Add(1)
	if s := &c.ring[e.slot]; !s.ref.Load() {
		s.ref.Store(true)
	}
	return e.worker, true
}

// Record notes that worker served key. Re-recording a key on the same worker
// writes nothing; a new key may evict an old one.
func (c *Cache) Record(key, worker uint64) {
	if e, ok := c.m.Load(key); ok {
		if e.worker != worker {
			c.m.Store(key, cached{worker: worker, slot: e.slot})
		}
		return
	}
	n := uint64(len(c.ring))
	for step := uint64(0); step < 2*n+1; step++ {
		i := (c.hand.Add(1) - 1) % n
		s := &c.ring[i]
		if s.ref.Swap(false) && step < 2*n {
			continue // second chance
		}
		// Map first, ring second: whoever swaps a key out of the ring finds
		// its entry stored, so no entry outlives its slot.
		slot := uint32(i)
		c.m.Store(key, cached{worker: worker, slot: slot})
		if old := s.key.Swap(key); old != 0 && old != key {
			c.m.Compute(old, func(e cached, loaded bool) (cached, bool) {
				return e, !loaded || e.slot == slot // drop old only if it still lives in this slot
			})
		}
		return
	}
}

// Len returns the number of keys held.
func (c *Cache) Len() int { return c.m.Size() }

// Hits returns how many lookups found their key.
func (c *Cache) Hits() uint64 { return c.hits.Load() }

// Misses returns how many lookups found no key.
func (c *Cache) Misses() uint64 { return c.misses.Load() }
