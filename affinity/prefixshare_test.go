package affinity

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What one replica records anew reaches another's table, and only that.
func TestRecordedPrefixesAreLearnedElsewhere(t *testing.T) {
	a, b := NewPrefixes(1024), NewPrefixes(1024)
	a.Share(64)
	b.Share(64)
	doc := prefixKeys("m", strings.Repeat("d", 64), 16, 64)         // 4 blocks
	turn := prefixKeys("m", strings.Repeat("d", 64)+"next", 16, 64) // the same 4, nothing new whole
	a.Record(doc, 2)
	out, lost := a.Changed(nil)
	assert.Zero(t, lost)
	require.Len(t, out, 4*PrefixRecordBytes)

	n, err := b.Learn(out)
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	w, blocks := b.Holder(turn)
	assert.Equal(t, uint64(2), w)
	assert.Equal(t, 4, blocks)
	again, _ := b.Changed(nil)
	assert.Empty(t, again, "what a replica learns is not shared again")

	a.Record(doc, 2) // nothing new
	again, _ = a.Changed(nil)
	assert.Empty(t, again)
	a.Record(doc[:1], 3) // the first block moved
	again, _ = a.Changed(again)
	require.Len(t, again, PrefixRecordBytes)
	_, _ = b.Learn(again)
	w, blocks = b.Holder(doc[:1])
	assert.Equal(t, uint64(3), w)
	assert.Equal(t, 1, blocks)
}

// A record is sent with the worker its slot holds when it is read: a key
// moved twice is sent twice, naming the last worker; one whose slot went
// to another key is not sent.
func TestChangedSendsWhatTheSlotHoldsNow(t *testing.T) {
	p := NewPrefixes(64)
	p.Share(64)
	k1, k2 := uint64(0xAAAA_0000_0000_0005), uint64(0xBBBB_0000_0000_0005) // one slot
	k3 := uint64(0xCCCC_0000_0000_0007)
	p.Record([]uint64{k3}, 1)
	p.Record([]uint64{k3}, 2)
	p.Record([]uint64{k1}, 1)
	p.Record([]uint64{k2}, 4)
	out, _ := p.Changed(nil)
	q := NewPrefixes(64)
	n, err := q.Learn(out)
	require.NoError(t, err)
	assert.Equal(t, 3, n) // k3 twice, k2; not k1
	w, _ := q.Holder([]uint64{k3})
	assert.Equal(t, uint64(2), w)
	w, _ = q.Holder([]uint64{k1})
	assert.Zero(t, w)
	w, _ = q.Holder([]uint64{k2})
	assert.Equal(t, uint64(4), w)
}

// A reader a whole ring behind loses the oldest keys and says how many.
func TestTheJournalWrapsAndCountsWhatItLost(t *testing.T) {
	p := NewPrefixes(1024)
	p.Share(64)
	keys := make([]uint64, 100)
	for i := range keys {
		keys[i] = uint64(i+1)<<32 | uint64(i)
	}
	p.Record(keys, 7)
	out, lost := p.Changed(nil)
	assert.Equal(t, uint64(36), lost)
	assert.Len(t, out, 64*PrefixRecordBytes)
	out, lost = p.Changed(out[:0])
	assert.Zero(t, lost)
	assert.Empty(t, out)
}

// A place a writer took but has not filled yet holds back the reader: the
// key is read at a later call, with those after it, not skipped (which
// lost records under load: a replica then never learned them). A place
// that stays empty is given up after maxJournalWaits calls.
func TestTheReaderWaitsForAPlaceItsWriterHasNotFilled(t *testing.T) {
	p := NewPrefixes(1024)
	p.Share(64)
	j := p.journal
	k1, k2 := uint64(0xAAAA_0000_0000_0011), uint64(0xBBBB_0000_0000_0022)
	p.slots[k1&p.mask].Store(k1&^MaxPrefixWorker | 1)
	j.head.Add(1)             // a writer took the place of k1, and has not stored it yet
	p.Record([]uint64{k2}, 2) // the next writer is done
	out, lost := p.Changed(nil)
	assert.Zero(t, lost)
	assert.Empty(t, out, "nothing is read past the empty place")
	j.keys[0].Store(k1) // the first writer's store lands
	out, _ = p.Changed(nil)
	assert.Equal(t, AppendPrefixRecord(AppendPrefixRecord(nil, k1, 1), k2, 2), out)
	assert.Equal(t, uint64(2), p.Recorded())

	j.head.Add(1) // a writer that never fills its place
	p.Record([]uint64{k2}, 3)
	for range maxJournalWaits {
		out, _ = p.Changed(out[:0])
		require.Empty(t, out)
	}
	out, _ = p.Changed(out[:0])
	assert.Equal(t, AppendPrefixRecord(nil, k2, 3), out, "given up on, the empty place lets the next through")
}

func TestLearnRefusesTornRecords(t *testing.T) {
	p := NewPrefixes(64)
	_, err := p.Learn(make([]byte, 13))
	require.ErrorIs(t, err, ErrPrefixRecords)
	n, err := p.Learn(AppendPrefixRecord(nil, 0xAAAA_0000_0000_0001, 0))
	require.NoError(t, err)
	assert.Zero(t, n, "worker 0 names no worker")
	w, _ := p.Holder([]uint64{0xAAAA_0000_0000_0001})
	assert.Zero(t, w)
	none := NewPrefixes(64) // no journal
	out, lost := none.Changed(nil)
	assert.Empty(t, out)
	assert.Zero(t, lost)
}

// Records, lookups, a reader of the journal and learning from another
// replica run at once without a lock (run under -race).
func TestSharedPrefixesConcurrently(t *testing.T) {
	p := NewPrefixes(256)
	p.Share(128)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		var out []byte
		for {
			select {
			case <-stop:
				return
			default:
			}
			out, _ = p.Changed(out[:0])
			if _, err := p.Learn(out); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var writers sync.WaitGroup
	for g := 1; g <= 4; g++ {
		writers.Add(1)
		go func(worker uint64) {
			defer writers.Done()
			keys := prefixKeys("m", strings.Repeat("x", 64*int(worker)), 8, 64)
			for i := 0; i < 2000; i++ {
				p.Record(keys, worker+uint64(i%2)*4)
				if w, _ := p.Holder(keys); w == 0 || w > 8 {
					t.Errorf("holder %d", w)
					return
				}
			}
		}(uint64(g))
	}
	writers.Wait()
	close(stop)
	wg.Wait()
}

func TestRecordingIntoASharedTableAllocatesNothing(t *testing.T) {
	p := NewPrefixes(1024)
	p.Share(1024)
	keys := prefixKeys("m", strings.Repeat("y", 1024), 16, 64)
	w := uint64(1)
	allocs := testing.AllocsPerRun(200, func() {
		w = w%3 + 1
		p.Record(keys, w)
	})
	assert.Zero(t, allocs)
}
