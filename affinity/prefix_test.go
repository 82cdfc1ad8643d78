package affinity

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func prefixKeys(seed, text string, block, max int) []uint64 {
	var h PrefixHasher
	h.Reset([]byte(seed), block, max, nil)
	h.Write([]byte(text))
	return h.Keys()
}

func TestPrefixKeysNameWhatCameBefore(t *testing.T) {
	a := prefixKeys("m", strings.Repeat("a", 40)+"XYZ", 8, 100)
	require.Len(t, a, 5, "43 bytes are 5 whole blocks of 8; the last 3 bytes key nothing")
	b := prefixKeys("m", strings.Repeat("a", 32)+"bbbbbbbbbbbbbbbb", 8, 100)
	require.Len(t, b, 6)
	assert.Equal(t, a[:4], b[:4], "the same first 32 bytes, the same first 4 keys")
	assert.NotEqual(t, a[4], b[4])
	assert.NotEqual(t, b[4], b[5], "a repeated block is keyed by all before it")

	c := prefixKeys("other-model", strings.Repeat("a", 40), 8, 100)
	assert.NotEqual(t, a[0], c[0], "another model's prompt shares no key")

	var h PrefixHasher
	h.Reset([]byte("m"), 8, 100, make([]uint64, 0, 8))
	for _, piece := range []string{"aaa", "", "aaaaaaaaaaaaaaaaaaaaaaaaaa", "aaaaaaaaaaa", "XYZ"} {
		h.Write([]byte(piece))
	}
	assert.Equal(t, a, h.Keys(), "pieces of any size key as one write does")

	assert.Equal(t, a[:2], prefixKeys("m", strings.Repeat("a", 40), 8, 2), "at most max keys")
	assert.Empty(t, prefixKeys("m", "short", 8, 100))
	assert.Empty(t, prefixKeys("m", "no block size keys nothing", 0, 100))

	keys := make([]uint64, 0, 16)
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		h.Reset([]byte("m"), 8, 16, keys)
		h.Write([]byte("a prompt of more than a few blocks, which fills the keys"))
	}), "hashing into keys with room allocates nothing")
}

func TestPrefixHolderIsTheLongestPrefixs(t *testing.T) {
	p := NewPrefixes(1000)
	assert.Len(t, p.slots, 1024, "1000 slots asked for, rounded up to a power of two")
	system := strings.Repeat("you are a helpful assistant. ", 10)
	turn1 := prefixKeys("m", system+"user: hello, tell me about the weather", 16, 64)
	turn2 := prefixKeys("m", system+"user: hello, tell me about the weather assistant: sunny. user: and tomorrow?", 16, 64)
	other := prefixKeys("m", system+"user: something else entirely, please", 16, 64)

	w, n := p.Holder(turn2)
	assert.Equal(t, [2]uint64{0, 0}, [2]uint64{w, uint64(n)}, "nothing known")

	p.Record(turn1, 3)
	p.Record(other, 5) // the system prompt's blocks now point at 5
	w, n = p.Holder(turn2)
	assert.Equal(t, uint64(3), w, "the conversation's own blocks outweigh the shared system prompt")
	assert.Equal(t, len(turn1), n)
	w, n = p.Holder(prefixKeys("m", system+"user: a new conversation", 16, 64))
	assert.Equal(t, uint64(5), w, "only the system prompt matches: its last server")
	assert.Equal(t, len(system)/16, n)

	p.Record(turn2, 4)
	w, n = p.Holder(turn2)
	assert.Equal(t, [2]uint64{4, uint64(len(turn2))}, [2]uint64{w, uint64(n)}, "the last server of a prefix holds it")

	p.Record(turn1, MaxPrefixWorker+1)
	w, _ = p.Holder(turn1)
	assert.Equal(t, uint64(4), w, "an id that does not fit a slot is not recorded")

	assert.Zero(t, testing.AllocsPerRun(100, func() {
		p.Record(turn2, 7)
		p.Holder(turn2)
	}))
}

// A slot taken over by another key forgets the older one; a lookup never
// mistakes one key for another whose upper half differs.
func TestPrefixSlotsAreTakenOver(t *testing.T) {
	p := NewPrefixes(64)
	k1, k2 := uint64(0xAAAA_0000_0000_0005), uint64(0xBBBB_0000_0000_0005) // one slot, two keys
	p.Record([]uint64{k1}, 1)
	p.Record([]uint64{k2}, 2)
	w, _ := p.Holder([]uint64{k1})
	assert.Zero(t, w)
	w, _ = p.Holder([]uint64{k2})
	assert.Equal(t, uint64(2), w)
}

// Records and lookups run at once without a lock (run under -race).
func TestPrefixesConcurrently(t *testing.T) {
	p := NewPrefixes(256)
	var wg sync.WaitGroup
	for g := 1; g <= 4; g++ {
		wg.Add(1)
		go func(worker uint64) {
			defer wg.Done()
			keys := prefixKeys("m", strings.Repeat("x", 64*int(worker)), 8, 64)
			for i := 0; i < 2000; i++ {
				p.Record(keys, worker)
				if w, _ := p.Holder(keys); w == 0 || w > 4 {
					t.Errorf("holder %d", w)
					return
				}
			}
		}(uint64(g))
	}
	wg.Wait()
}
