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
// it over from whatever key held it, so the table never grows, forgets a
// prefix when a newer one lands on its slot, and neither a lookup nor a
// record allocates or locks.
type Prefixes struct {
	slots   []atomic.Uint64
	mask    uint64
	journal *journal // nil unless Share was called
}

// MaxPrefixWorker is the largest worker id the prefix table records: a
// slot holds the id in 32 bits.
const MaxPrefixWorker = 1<<32 - 1

// decodeSalt moves keys into the decode key space (DecodeKeys).
const decodeSalt = 0x9e3779b97f4a7c15

// DecodeKeys appends keys to dst moved into a key space of their own, the
// decode pool's: with prefill/decode disaggregation a split prompt's KV
// cache is on two workers, its prefill worker (recorded under its keys)
// and its decode worker (recorded under these), and one table holds both.
func DecodeKeys(dst, keys []uint64) []uint64 {
	for _, k := range keys {
		dst = append(dst, k^decodeSalt)
	}
	return dst
}

// NewPrefixes returns a table of size slots, rounded up to a power of two
// (at least 64).
func NewPrefixes(size int) *Prefixes {
	n := roundSlots(size)
	return &Prefixes{slots: make([]atomic.Uint64, n), mask: uint64(n - 1)}
}

// roundSlots rounds size up to a power of two, at least 64.
func roundSlots(size int) int {
	n := 64
	if size > n {
		n = 1 << bits.Len(uint(size-1))
	}
	return n
}

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
			if p.journal != nil {
				p.journal.add(k)
			}
		}
	}
}

// PrefixHasher cuts a prompt, written to it piece by piece, into blocks of
// a fixed number of bytes and keys each whole block by everything written
// before its end: a block's key mixes the key before it with the block's
// xxhash, so two prompts share a block's key when they share everything up
// to it. The seed (the model's name) starts the chain, so the same text
// sent to two models shares nothing. The zero value is ready once Reset;
// it allocates nothing once its buffer (a block that spans pieces) and
// keys have grown.
type PrefixHasher struct {
	block int      // bytes a block
	max   int      // keys at most
	last  uint64   // the key of everything so far: the seed's, then the last block's
	part  []byte   // the current block's bytes, while it spans pieces
	keys  []uint64 // the keys of the whole blocks
}

// Reset starts a prompt: blocks of block bytes, at most max keys, appended
// to keys[:0] (whose capacity is reused). A block of no bytes keys nothing.
func (h *PrefixHasher) Reset(seed []byte, block, max int, keys []uint64) {
	if block <= 0 {
		max = 0
	}
	h.block, h.max, h.last, h.part, h.keys = block, max, xxhash.Sum64(seed), h.part[:0], keys[:0]
}

// Write adds the prompt's next bytes. A block that lies whole in p is
// hashed where it is; one that spans pieces is gathered first.
func (h *PrefixHasher) Write(p []byte) {
	for len(p) > 0 && len(h.keys) < h.max {
		if len(h.part) == 0 && len(p) >= h.block {
			h.chain(p[:h.block])
			p = p[h.block:]
			continue
		}
		n := min(h.block-len(h.part), len(p))
		h.part = append(h.part, p[:n]...)
		p = p[n:]
		if len(h.part) == h.block {
			h.chain(h.part)
			h.part = h.part[:0]
		}
	}
}

// chain keys the next whole block: the key before it and the block's
// hash, mixed (a multiply by the golden ratio, then MurmurHash3's
// finalizer, so that neither order nor equal halves cancel out).
func (h *PrefixHasher) chain(block []byte) {
	x := h.last*0x9e3779b97f4a7c15 ^ xxhash.Sum64(block)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	h.last = x
	h.keys = append(h.keys, x)
}

// Keys returns the keys of the whole blocks written so far; a last
// partial block has none.
func (h *PrefixHasher) Keys() []uint64 { return h.keys }
