// Package pickers holds the allocation-free selection policies of fastroute.
//
// A picker chooses one index out of a candidate list. It reads live state
// through the State interface, implemented by the data plane over its worker
// snapshot, so no closure or per-request map is built on the hot path.
package pickers

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"

	"golang.org/x/sys/cpu"
)

// State gives a picker read access to the live state of the candidates.
// Every slice is aligned with the candidate id slice passed to Pick.
type State interface {
	// Occupancy returns the live in-flight counters of the candidates.
	// Pickers only Load them; the data plane owns every update.
	Occupancy() []*atomic.Int64
	// Weights returns the telemetry weights of the candidates, built for
	// O(1) draws; nil or a zero total means there are none.
	Weights() *WeightTable
}

// Picker selects one candidate. Pick returns an index into ids, or -1 when
// ids is empty. Implementations are safe for concurrent use and allocate
// nothing.
type Picker interface {
	Pick(ids []uint64, st State) int
}

// Mode names a selection policy as written in the config.
type Mode string

// The selection modes of DESIGN.md.
const (
	ModeRoundRobin  Mode = "round-robin"
	ModeRandom      Mode = "random"
	ModeP2C         Mode = "power-of-two-choices"
	ModeLeastLoaded Mode = "least-loaded"
	ModeDirect      Mode = "direct"
	ModeWeighted    Mode = "device-aware-weighted"
	ModeLoadAware   Mode = "load-aware"
)

// Modes lists every valid mode, in documentation order.
var Modes = []Mode{ModeRoundRobin, ModeRandom, ModeP2C, ModeLeastLoaded, ModeDirect, ModeWeighted, ModeLoadAware}

// ParseMode validates a mode name.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown mode %q (want one of %v)", s, Modes)
}

// New returns the picker for mode. Direct mode needs none: the request names
// its worker, so New returns a nil Picker and no error for it.
func New(m Mode) (Picker, error) {
	switch m {
	case ModeRoundRobin:
		return &RoundRobin{}, nil
	case ModeRandom:
		return Random{}, nil
	case ModeP2C:
		return P2C{}, nil
	case ModeLeastLoaded:
		return &LeastLoaded{}, nil
	case ModeDirect:
		return nil, nil
	case ModeWeighted:
		return Weighted{}, nil
	case ModeLoadAware:
		return LoadAware{}, nil
	}
	return nil, fmt.Errorf("unknown mode %q", m)
}

// paddedCounter keeps a hot atomic counter on its own cache line.
type paddedCounter struct {
	_ cpu.CacheLinePad
	n atomic.Uint64
	_ cpu.CacheLinePad
}

// RoundRobin cycles through the candidates with one atomic counter.
type RoundRobin struct {
	next paddedCounter
}

// Pick returns the next index in cyclic order.
func (r *RoundRobin) Pick(ids []uint64, _ State) int {
	n := len(ids)
	if n == 0 {
		return -1
	}
	return int((r.next.n.Add(1) - 1) % uint64(n))
}

// Random picks uniformly at random (math/rand/v2 top-level, per-thread source).
type Random struct{}

// Pick returns a uniform random index.
func (Random) Pick(ids []uint64, _ State) int {
	n := len(ids)
	if n == 0 {
		return -1
	}
	return scale(rand.Uint32(), n)
}

// scale maps a uniform 32-bit value onto [0, n) by multiply-shift (Lemire);
// the bias is below n/2^32, far under any sampling noise at fleet sizes.
func scale(x uint32, n int) int {
	return int((uint64(x) * uint64(n)) >> 32)
}

// P2C is power-of-two-choices: two distinct uniform samples, the one with the
// lower occupancy wins. It reads exactly two occupancies.
type P2C struct{}

// Pick returns the less loaded of two distinct random candidates.
func (P2C) Pick(ids []uint64, st State) int {
	n := len(ids)
	switch n {
	case 0:
		return -1
	case 1:
		return 0
	}
	r := rand.Uint64()
	a := scale(uint32(r>>32), n)
	b := scale(uint32(r), n-1)
	if b >= a {
		b++
	}
	occ := st.Occupancy()
	if occ[b].Load() < occ[a].Load() {
		return b
	}
	return a
}

// LeastLoaded picks the minimum occupancy; ties go to the first minimum found
// from a rotating start, so equal load spreads across the tied workers.
type LeastLoaded struct {
	start paddedCounter
}

// Pick scans every candidate once.
func (l *LeastLoaded) Pick(ids []uint64, st State) int {
	n := len(ids)
	if n == 0 {
		return -1
	}
	occ := st.Occupancy()[:n]
	s := int((l.start.n.Add(1) - 1) % uint64(n))
	best, bestLoad := s, occ[s].Load()
	// Scan s+1..n-1, then 0..s-1: the first minimum from the rotating start wins.
	for i := s + 1; i < n; i++ {
		if v := occ[i].Load(); v < bestLoad {
			best, bestLoad = i, v
		}
	}
	for i := 0; i < s; i++ {
		if v := occ[i].Load(); v < bestLoad {
			best, bestLoad = i, v
		}
	}
	return best
}

// Weighted picks by engine cost when every candidate has one (see Coster),
// else by telemetry weight, tilted by live load.
//
// Without engine costs it draws a candidate with probability proportional to its weight from the
// alias table (O(1)). An idle draw is taken as is, so an idle fleet splits
// exactly by weight. A busy draw is compared with a second weighted draw and
// the higher Weight/(1+Load) wins, so a burst spreads at once instead of
// herding on the heaviest worker between telemetry polls. With no positive
// weight it falls back to power-of-two-choices.
type Weighted struct{}

// Pick returns a weighted choice combining telemetry weight and live load.
func (Weighted) Pick(ids []uint64, st State) int {
	n := len(ids)
	if n == 0 {
		return -1
	}
	if i := leastCost(n, st); i >= 0 {
		return i
	}
	t := st.Weights()
	if t == nil || len(t.keep) != n || !(t.total > 0) {
		return P2C{}.Pick(ids, st)
	}
	r := rand.Uint64()
	occ := st.Occupancy()
	a := t.Draw(r)
	la := occ[a].Load()
	if la == 0 {
		return a
	}
	b := t.Draw(remix(r))
	if b == a {
		return a
	}
	// weight[b]/(1+lb) > weight[a]/(1+la), without dividing.
	if t.weight[b]*float64(1+la) > t.weight[a]*float64(1+occ[b].Load()) {
		return b
	}
	return a
}

// remix derives a second uniform value from r (the splitmix64 finalizer), so
// one call to the random source serves two draws.
func remix(r uint64) uint64 {
	r += 0x9e3779b97f4a7c15
	r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9
	r = (r ^ (r >> 27)) * 0x94d049bb133111eb
	return r ^ (r >> 31)
}
