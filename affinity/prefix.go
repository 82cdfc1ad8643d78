package affinity

import (
	"math/bits"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// Prefixes remembers which worker last served each prompt prefix, so a
// request that shares a long prefix with an earlier one (the turns of one
// conversation, a long system prompt or document) can go where the engine
// still holds that prefix's KV cache. A prefix is named by the key of its
// last block (PrefixHasher). The table is a fixed array of slots, one word
// each: the key's upper half beside the id of the worker, read and written
// with atomics. A key's slot is chosen by its low bits, and a new key takes
// it over from an older one, so the table never grows, forgets the least
// recently recorded prefixes first (roughly), and neither a lookup nor a
// record allocates or locks.
type Prefixes struct {
	slots []atomic.Uint64
	mask  uint64
}

// MaxPrefixWorker is the largest worker id the prefix table records: a
// slot holds the id in 32 bits.
const MaxPrefixWorker = 1<<32 - 1

// NewPrefixes returns a table of size slots, rounded up to a power of two
// (at least 64).
func NewPrefixes(size int) *Prefixes {
	n := 64
	if size > n {
		n = 1 << bits.Len(uint(size-1))
	}
	return &Prefixes{slots: make([]atomic.Uint64, n), mask: uint64(n - 1)}
}

// Len returns the table's slots.
func (p *Prefixes) Len() int { return len(p.slots) }

// Holder returns the worker that last served the longest of keys'
// prefixes (keys in prompt order, as PrefixHasher gives them) and how many
// blocks that prefix spans; 0, 0 when no prefix is known.
func (p *Prefixes) Holder(keys []uint64) (worker uint64, blocks int) {
	for i := len(keys) - 1; i >= 0; i-- {
		k := keys[i]
		if v := p.slots[k&p.mask].Load(); v != 0 && v>>32 == k>>32 {
			return v & MaxPrefixWorker, i + 1
		}
	}
	return 0, 0
}

// Record notes that worker served every prefix of keys. A worker id above
// MaxPrefixWorker is not recorded.
func (p *Prefixes) Record(keys []uint64, worker uint64) {
	if worker == 0 || worker > MaxPrefixWorker {
		return
	}
	for _, k := range keys {
		s := &p.slots[k&p.mask]
		if v := k&^MaxPrefixWorker | worker; s.Load() != v { // no write, no shared cache line dirtied, when nothing changes
			s.Store(v)
		}
	}
}

// PrefixHasher cuts a prompt, written to it piece by piece, into blocks of
// a fixed number of bytes and keys each whole block by the hash of
// everything written before its end: two prompts share a block's key when
// they share everything up to it. The seed (the model's name) is hashed
// first, so the same text sent to two models shares nothing. The zero
// value is ready once Reset; it allocates nothing while keys has room.
type PrefixHasher struct {
	d     xxhash.Digest
	block int // bytes a block
	fill  int // bytes of the current block written
	max   int // keys at most
	keys  []uint64
}

// Reset starts a prompt: blocks of block bytes, at most max keys, appended
// to keys[:0] (whose capacity is reused). A block of no bytes keys nothing.
func (h *PrefixHasher) Reset(seed []byte, block, max int, keys []uint64) {
	h.d.Reset()
	_, _ = h.d.Write(seed)
	_, _ = h.d.Write([]byte{0})
	if block <= 0 {
		max = 0
	}
	h.block, h.fill, h.max, h.keys = block, 0, max, keys[:0]
}

// Write adds the prompt's next bytes.
func (h *PrefixHasher) Write(p []byte) {
	for len(p) > 0 && len(h.keys) < h.max {
		n := min(h.block-h.fill, len(p))
		_, _ = h.d.Write(p[:n])
		h.fill += n
		p = p[n:]
		if h.fill == h.block {
			h.keys = append(h.keys, h.d.Sum64())
			h.fill = 0
		}
	}
}

// Keys returns the keys of the whole blocks written so far; a last
// partial block has none.
func (h *PrefixHasher) Keys() []uint64 { return h.keys }
