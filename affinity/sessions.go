// Package affinity holds fastroute's sticky-routing tables: session pins
// (session id → worker and data-parallel rank, with an idle TTL and a bounded
// size), the embedding cache (input hash → the worker that served it) and
// the prompt prefix table (prefix key → the worker last sent it). The first
// two live on xsync maps keyed by xxhash, so the request path looks them up
// without locks and without allocating; only storing a new session or cache
// key allocates. The prefix table is a fixed array of atomic words, which
// neither a lookup nor a record allocates.
package affinity

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fastroute/fastroute/internal/every"
	"github.com/puzpuzpuz/xsync/v3"
)

// Mode is how strictly sessions stick to their worker.
type Mode uint8

// The session_affinity modes of the config.
const (
	Off  Mode = iota // no affinity
	Soft             // prefer the pinned worker while it is free, else re-pin
	Hard             // always the pinned worker; an error if it is gone
)

// ParseMode reads a config mode name.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "off":
		return Off, nil
	case "soft":
		return Soft, nil
	case "hard":
		return Hard, nil
	}
	return Off, fmt.Errorf("%q is not off, soft or hard", s)
}

// Pin is where a session goes.
type Pin struct {
	Worker uint64
	Rank   int
}

// State is the result of a lookup.
type State uint8

// Lookup results.
const (
	Missing State = iota // no pin
	Pinned               // pin valid
	Lost                 // the pinned worker left; Pin.Worker names it
)

// Options configures a Table.
type Options struct {
	TTL         time.Duration    // idle time after which a pin expires
	MaxSessions int              // bound; the earliest-created session goes first
	Now         func() time.Time // clock (tests inject one); default time.Now
}

// Table maps session ids to pins.
//
// The request path reads a coarse clock that Tick advances, so a lookup does
// not call time.Now. Expiry is done by Tick (run it with Run), never on the
// request path. The size bound is a ring of the sessions in creation order:
// creating a session beyond MaxSessions evicts the one created MaxSessions
// sessions earlier, if it is still there (SetMaxSessions resizes it).
type Table struct {
	opts    Options
	ttl     atomic.Int64  // nanoseconds: opts.TTL until SetTTL
	sweep   *every.Period // how often Run ticks: sweepEvery(ttl)
	m       *xsync.MapOf[uint64, *session]
	ring    atomic.Pointer[[]atomic.Uint64] // session hashes by creation slot, as many as the bound
	next    atomic.Uint64                   // next creation slot
	size    atomic.Int64
	clock   atomic.Int64 // unix nanoseconds of the last Tick
	evicted atomic.Uint64
	expired atomic.Uint64
}

type session struct {
	id     string
	slot   uint64 // creation slot in the ring
	worker atomic.Uint64
	rank   atomic.Int64
	lost   atomic.Bool  // worker left; a hard session gets an error once
	used   atomic.Int64 // clock of the last use
}

// NewTable returns an empty table; its clock starts at opts.Now().
func NewTable(opts Options) *Table {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = 100000
	}
	t := &Table{opts: opts, m: xsync.NewMapOfWithHasher[uint64, *session](rehash), sweep: every.NewPeriod(sweepEvery(opts.TTL))}
	ring := make([]atomic.Uint64, opts.MaxSessions)
	t.ring.Store(&ring)
	t.ttl.Store(int64(opts.TTL))
	t.clock.Store(opts.Now().UnixNano())
	return t
}

// SetTTL changes the idle time after which a pin expires: the next Tick
// expires by it (a shorter one drops the sessions idle longer at once), and
// Run ticks at its new period from then on.
func (t *Table) SetTTL(d time.Duration) {
	if d <= 0 {
		return
	}
	t.ttl.Store(int64(d))
	t.sweep.Set(sweepEvery(d))
}

// SetMaxSessions bounds the table at n sessions (n > 0) from now on, as
// if it had been made with it: the sessions created more than n sessions
// ago are evicted at once (counted as max_sessions evictions), and each
// session created next evicts the one created n earlier. It runs off the
// request path (a reload): a session created while it runs may escape the
// bound (its TTL still expires it).
func (t *Table) SetMaxSessions(n int) {
	if n <= 0 || n == len(*t.ring.Load()) {
		return
	}
	ring := make([]atomic.Uint64, n)
	next := t.next.Load()
	t.m.Range(func(h uint64, s *session) bool {
		if s.slot+uint64(n) >= next { // among the n created last: its place in the new ring
			ring[s.slot%uint64(n)].Store(h)
		} else {
			slot := s.slot
			t.deleteIf(h, func(s *session) bool { return s.slot == slot }, &t.evicted)
		}
		return true
	})
	t.ring.Store(&ring)
}

// TTL is the idle time after which a pin expires.
func (t *Table) TTL() time.Duration { return time.Duration(t.ttl.Load()) }

// sweepEvery is Run's period for a TTL: a tenth of it, within 100ms..10s.
// It is also the granularity of the sessions' idle clock.
func sweepEvery(ttl time.Duration) time.Duration {
	return min(max(ttl/10, 100*time.Millisecond), 10*time.Second)
}

// rehash is the map's hasher: keys are xxhash values already, so mixing in
// the seed is enough.
func rehash(k, seed uint64) uint64 { return k ^ seed }

// Get looks a session up and marks it used. It does not allocate.
func (t *Table) Get(id []byte) (Pin, State) {
	s, ok := t.m.Load(Key(id))
	if !ok || s.id != string(id) {
		return Pin{}, Missing
	}
	if now := t.clock.Load(); s.used.Load() != now {
		s.used.Store(now)
	}
	p := Pin{Worker: s.worker.Load(), Rank: int(s.rank.Load())}
	if s.lost.Load() {
		return p, Lost
	}
	return p, Pinned
}

// Put pins a session, creating it if needed (the only allocation).
func (t *Table) Put(id []byte, p Pin) {
	h := Key(id)
	now := t.clock.Load()
	if s, ok := t.m.Load(h); ok && s.id == string(id) {
		if s.worker.Load() != p.Worker || s.rank.Load() != int64(p.Rank) || s.lost.Load() {
			s.worker.Store(p.Worker)
			s.rank.Store(int64(p.Rank))
			s.lost.Store(false)
		}
		s.used.Store(now)
		return
	}
	s := &session{id: string(id), slot: t.next.Add(1) - 1}
	s.worker.Store(p.Worker)
	s.rank.Store(int64(p.Rank))
	s.used.Store(now)
	if _, loaded := t.m.LoadAndStore(h, s); !loaded { // loaded: a hash twin or a racing Put, replaced
		t.size.Add(1)
	}
	t.evictFor(s.slot, h)
}

// evictFor records slot's session in the ring and removes the session that
// held the slot one ring length earlier, if it is still in the table.
func (t *Table) evictFor(slot, h uint64) {
	ring := *t.ring.Load()
	n := uint64(len(ring))
	old := ring[slot%n].Swap(h)
	if old == 0 || slot < n {
		return
	}
	t.deleteIf(old, func(s *session) bool { return s.slot == slot-n }, &t.evicted)
}

// deleteIf removes h's session when cond holds, counting it in count (may be nil).
func (t *Table) deleteIf(h uint64, cond func(*session) bool, count *atomic.Uint64) {
	t.m.Compute(h, func(s *session, loaded bool) (*session, bool) {
		if loaded && cond(s) {
			t.size.Add(-1)
			if count != nil {
				count.Add(1)
			}
			return s, true
		}
		return s, !loaded // an absent key stays absent
	})
}

// Drop removes a session.
func (t *Table) Drop(id []byte) {
	sid := string(id)
	t.deleteIf(Key(id), func(s *session) bool { return s.id == sid }, nil)
}

// WorkerLeft marks every session pinned to worker as lost, so a hard
// session gets a clear error and a soft one re-pins. It runs off the request
// path (registry writes call it) and costs one pass over the table.
func (t *Table) WorkerLeft(worker uint64) {
	t.m.Range(func(_ uint64, s *session) bool {
		if s.worker.Load() == worker {
			s.lost.Store(true)
		}
		return true
	})
}

// Tick advances the table clock to Now and expires the sessions idle for
// longer than TTL. It returns how many expired.
func (t *Table) Tick() int {
	now := t.opts.Now().UnixNano()
	t.clock.Store(now)
	cutoff := now - t.ttl.Load()
	var stale []uint64
	t.m.Range(func(h uint64, s *session) bool {
		if s.used.Load() < cutoff {
			stale = append(stale, h)
		}
		return true
	})
	before := t.expired.Load()
	for _, h := range stale {
		t.deleteIf(h, func(s *session) bool { return s.used.Load() < cutoff }, &t.expired)
	}
	return int(t.expired.Load() - before)
}

// Run ticks until ctx ends, every tenth of the TTL (within 100ms..10s).
func (t *Table) Run(ctx context.Context) {
	t.sweep.Tick(ctx, func() { t.Tick() })
}

// Len returns the number of sessions held.
func (t *Table) Len() int { return int(t.size.Load()) }

// Evictions returns how many sessions were removed for the max_sessions
// bound and for their idle TTL.
func (t *Table) Evictions() (maxSessions, ttl uint64) { return t.evicted.Load(), t.expired.Load() }
