package affinity

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeClock is the injectable clock of the tests.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func newTable(ttl time.Duration, max int) (*Table, *fakeClock) {
	c := &fakeClock{}
	c.ns.Store(time.Unix(1000, 0).UnixNano())
	return NewTable(Options{TTL: ttl, MaxSessions: max, Now: c.now}), c
}

func TestParseMode(t *testing.T) {
	for s, want := range map[string]Mode{"off": Off, "soft": Soft, "hard": Hard} {
		m, err := ParseMode(s)
		require.NoError(t, err)
		assert.Equal(t, want, m)
	}
	_, err := ParseMode("sticky")
	assert.ErrorContains(t, err, `"sticky" is not off, soft or hard`)
}

func TestPinLookupAndRepin(t *testing.T) {
	tb, _ := newTable(time.Minute, 10)
	_, st := tb.Get([]byte("s1"))
	assert.Equal(t, Missing, st)
	tb.Put([]byte("s1"), Pin{Worker: 3, Rank: 1})
	p, st := tb.Get([]byte("s1"))
	assert.Equal(t, Pinned, st)
	assert.Equal(t, Pin{Worker: 3, Rank: 1}, p)
	tb.Put([]byte("s1"), Pin{Worker: 4})
	p, _ = tb.Get([]byte("s1"))
	assert.Equal(t, Pin{Worker: 4}, p)
	assert.Equal(t, 1, tb.Len())
	tb.Drop([]byte("s1"))
	assert.Zero(t, tb.Len())
	_, st = tb.Get([]byte("s1"))
	assert.Equal(t, Missing, st)
}

func TestWorkerLeftMarksItsSessionsLost(t *testing.T) {
	tb, _ := newTable(time.Minute, 10)
	tb.Put([]byte("a"), Pin{Worker: 1})
	tb.Put([]byte("b"), Pin{Worker: 2})
	tb.WorkerLeft(1)
	p, st := tb.Get([]byte("a"))
	assert.Equal(t, Lost, st)
	assert.EqualValues(t, 1, p.Worker)
	_, st = tb.Get([]byte("b"))
	assert.Equal(t, Pinned, st)
	tb.Put([]byte("a"), Pin{Worker: 2}) // a soft session re-pins
	_, st = tb.Get([]byte("a"))
	assert.Equal(t, Pinned, st)
}

func TestTTLExpiresIdleSessionsOnly(t *testing.T) {
	tb, clock := newTable(10*time.Second, 10)
	tb.Put([]byte("idle"), Pin{Worker: 1})
	tb.Put([]byte("busy"), Pin{Worker: 2})
	for i := 0; i < 4; i++ {
		clock.advance(4 * time.Second)
		tb.Tick()
		tb.Get([]byte("busy")) // used every 4 s
	}
	// 16 s passed: "idle" was last used at t0 (> 10 s ago), "busy" 0 s ago.
	_, st := tb.Get([]byte("idle"))
	assert.Equal(t, Missing, st)
	_, st = tb.Get([]byte("busy"))
	assert.Equal(t, Pinned, st)
	assert.Equal(t, 1, tb.Len())
	_, expired := tb.Evictions()
	assert.EqualValues(t, 1, expired)
	clock.advance(11 * time.Second)
	assert.Equal(t, 1, tb.Tick())
	assert.Zero(t, tb.Len())
}

// SetTTL expires by the new TTL from the next sweep, and Run sweeps at
// the new one's period from then on (an hour's TTL swept every 10 s).
func TestSetTTLAppliesToTheNextSweep(t *testing.T) {
	tb, clock := newTable(time.Hour, 10)
	tb.Put([]byte("a"), Pin{Worker: 1})
	clock.advance(2 * time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { tb.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	tb.SetTTL(time.Second)
	assert.Equal(t, time.Second, tb.TTL())
	assert.Eventually(t, func() bool { return tb.Len() == 0 }, 2*time.Second, 10*time.Millisecond,
		"idle 2 s past a 1 s TTL, swept every 100 ms")
	_, expired := tb.Evictions()
	assert.EqualValues(t, 1, expired)
	tb.SetTTL(0) // not a TTL: ignored
	assert.Equal(t, time.Second, tb.TTL())
}

// A new bound applies as if the table had been made with it: shrunk, the
// sessions created more than the bound ago go at once; grown, the next
// sessions evict by the larger bound, and concurrent puts keep the count
// exact (race detector).
func TestSetMaxSessionsResizesTheBound(t *testing.T) {
	tb, _ := newTable(time.Hour, 10)
	for i := range 8 {
		tb.Put(fmt.Appendf(nil, "s%d", i), Pin{Worker: 1})
	}
	tb.Drop([]byte("s6"))
	tb.SetMaxSessions(3) // s5, s6 (dropped) and s7 were created last
	assert.Equal(t, 2, tb.Len())
	for _, id := range []string{"s5", "s7"} {
		_, st := tb.Get([]byte(id))
		assert.Equal(t, Pinned, st, id)
	}
	evicted, _ := tb.Evictions()
	assert.EqualValues(t, 5, evicted)
	tb.Put([]byte("s8"), Pin{Worker: 1}) // evicts s5, created 3 earlier
	tb.Put([]byte("s9"), Pin{Worker: 1}) // s6's slot: gone already
	_, st := tb.Get([]byte("s5"))
	assert.Equal(t, Missing, st)
	assert.Equal(t, 3, tb.Len(), "s7, s8, s9")

	tb.SetMaxSessions(5)
	for i := 10; i < 12; i++ {
		tb.Put(fmt.Appendf(nil, "s%d", i), Pin{Worker: 1})
	}
	assert.Equal(t, 5, tb.Len(), "grown: nothing evicted yet")
	tb.Put([]byte("s12"), Pin{Worker: 1})
	_, st = tb.Get([]byte("s7"))
	assert.Equal(t, Missing, st, "s7 was created 5 sessions before s12")
	assert.Equal(t, 5, tb.Len())

	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				tb.Put(fmt.Appendf(nil, "g%d-%d", g, i), Pin{Worker: 1})
			}
		})
	}
	for i := range 20 {
		tb.SetMaxSessions(50 + i%3*25)
	}
	wg.Wait()
	tb.SetMaxSessions(40)
	n := 0
	tb.m.Range(func(uint64, *session) bool { n++; return true })
	assert.Equal(t, n, tb.Len(), "the count follows the table")
	assert.LessOrEqual(t, n, 40+4, "the bound, but for sessions created while it was set")
}

func TestMaxSessionsEvictsTheOldestCreated(t *testing.T) {
	tb, _ := newTable(time.Hour, 3)
	for i := 0; i < 5; i++ {
		tb.Put(fmt.Appendf(nil, "s%d", i), Pin{Worker: uint64(i + 1)})
	}
	assert.Equal(t, 3, tb.Len())
	for i, want := range []State{Missing, Missing, Pinned, Pinned, Pinned} {
		_, st := tb.Get(fmt.Appendf(nil, "s%d", i))
		assert.Equal(t, want, st, "s%d", i)
	}
	evicted, _ := tb.Evictions()
	assert.EqualValues(t, 2, evicted)
	// A session recreated after eviction is new: s0 comes back, s2 (oldest) goes.
	tb.Put([]byte("s0"), Pin{Worker: 9})
	_, st := tb.Get([]byte("s2"))
	assert.Equal(t, Missing, st)
	assert.Equal(t, 3, tb.Len())
}

func TestKnownSessionLookupDoesNotAllocate(t *testing.T) {
	tb, _ := newTable(time.Minute, 100)
	id := []byte("0b7c1c3e-6f1a-4d43-9a57-3c2f0e1d5b9a") // longer than Go's 32-byte stack buffer
	tb.Put(id, Pin{Worker: 7})
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		if _, st := tb.Get(id); st != Pinned {
			t.Fatal("lost the pin")
		}
	}))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { tb.Put(id, Pin{Worker: 7}) }), "re-pinning a known session")
}

// TestManySessionsConcurrently: 64 goroutines create, read, re-pin, drop and
// expire sessions at once; the size counter must match the map at the end.
func TestManySessionsConcurrently(t *testing.T) {
	tb, clock := newTable(time.Second, 500)
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 400; i++ {
				id := fmt.Appendf(nil, "s%d", (g*131+i)%900)
				switch i % 5 {
				case 0, 1:
					tb.Put(id, Pin{Worker: uint64(i%4 + 1)})
				case 2:
					tb.Get(id)
				case 3:
					tb.Drop(id)
				default:
					tb.WorkerLeft(uint64(i%4 + 1))
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 50; i++ {
			clock.advance(50 * time.Millisecond)
			tb.Tick()
		}
	}()
	wg.Wait()
	assert.Equal(t, tb.m.Size(), tb.Len())
	assert.LessOrEqual(t, tb.Len(), 500+64, "bounded (racing creations may overshoot by one each)")
	clock.advance(time.Hour)
	tb.Tick()
	assert.Zero(t, tb.Len())
	assert.Zero(t, tb.m.Size())
}

func TestCacheClockEviction(t *testing.T) {
	c := NewCache(4)
	for k := uint64(1); k <= 4; k++ {
		c.Record(k, k*10)
	}
	w, ok := c.Lookup(2)
	require.True(t, ok)
	assert.EqualValues(t, 20, w)
	c.Record(5, 50) // the hand passes 2 (referenced) and... evicts 1, the first unreferenced
	_, ok = c.Lookup(1)
	assert.False(t, ok)
	_, ok = c.Lookup(2)
	assert.True(t, ok, "a referenced key gets a second chance")
	assert.Equal(t, 4, c.Len())
	c.Record(2, 99)
	w, _ = c.Lookup(2)
	assert.EqualValues(t, 99, w, "re-served elsewhere")
	assert.EqualValues(t, 3, c.Hits())
	assert.EqualValues(t, 1, c.Misses())
	k := Key([]byte("hello"))
	assert.Equal(t, k, Key([]byte("hello")))
	assert.NotEqual(t, k, Key([]byte("hellO")))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { c.Lookup(k); c.Lookup(2) }))
	assert.Zero(t, testing.AllocsPerRun(1000, func() { c.Record(2, 99) }), "re-recording does not allocate")
}

func TestCacheConcurrentRecordStaysBounded(t *testing.T) {
	c := NewCache(64)
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				k := uint64(g*1000 + i%200 + 1)
				if _, ok := c.Lookup(k); !ok {
					c.Record(k, uint64(g))
				}
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, c.Len(), 64, "no entry outlives its slot")
	assert.EqualValues(t, 32*500, c.Hits()+c.Misses())
}

func BenchmarkTableGet(b *testing.B) {
	tbl := NewTable(Options{TTL: time.Minute, MaxSessions: 20000})
	for i := 0; i < 10000; i++ {
		tbl.Put(fmt.Appendf(nil, "session-%d", i), Pin{Worker: uint64(i%64 + 1)})
	}
	id := []byte("0b7c1c3e-6f1a-4d43-9a57-3c2f0e1d5b9a")
	tbl.Put(id, Pin{Worker: 42, Rank: 1})
	b.ReportAllocs()
	for b.Loop() {
		tbl.Get(id)
	}
}
