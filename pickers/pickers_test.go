package pickers

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testState is a State over plain slices of real atomic counters.
type testState struct {
	occ    []*atomic.Int64
	weight []float64
	table  WeightTable
}

func newTestState(n int) *testState {
	st := &testState{occ: make([]*atomic.Int64, n), weight: make([]float64, n)}
	for i := range st.occ {
		st.occ[i] = new(atomic.Int64)
		st.weight[i] = 1
	}
	st.recum()
	return st
}

// recum rebuilds the weight table from s.weight.
func (s *testState) recum() {
	s.table.Reset()
	for _, w := range s.weight {
		s.table.Append(w)
	}
	s.table.Build()
}

func (s *testState) setLoads(loads ...int64) {
	for i, v := range loads {
		s.occ[i].Store(v)
	}
}

func (s *testState) Occupancy() []*atomic.Int64 { return s.occ }
func (s *testState) Weights() *WeightTable      { return &s.table }

func ids(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// allPickers builds one picker of every mode that has one (direct needs the
// worker named), so a new mode is tested and benchmarked once it is in Modes.
func allPickers() map[Mode]Picker {
	out := map[Mode]Picker{}
	for _, m := range Modes {
		if p, err := New(m); err == nil && p != nil {
			out[m] = p
		}
	}
	return out
}

func TestEmptyCandidatesReturnMinusOne(t *testing.T) {
	for name, p := range allPickers() {
		assert.Equal(t, -1, p.Pick(nil, newTestState(0)), name)
	}
}

func TestPickAlwaysInRange(t *testing.T) {
	for name, p := range allPickers() {
		for n := 1; n <= 9; n++ {
			st := newTestState(n)
			for k := 0; k < 200; k++ {
				st.occ[k%n].Store(int64(k % 5))
				got := p.Pick(ids(n), st)
				require.True(t, got >= 0 && got < n, "%s n=%d got %d", name, n, got)
			}
		}
	}
}

func TestRoundRobinCyclesInOrder(t *testing.T) {
	rr := &RoundRobin{}
	st := newTestState(4)
	st.setLoads(9, 0, 9, 0)
	var got []int
	for k := 0; k < 10; k++ {
		got = append(got, rr.Pick(ids(4), st))
	}
	assert.Equal(t, []int{0, 1, 2, 3, 0, 1, 2, 3, 0, 1}, got, "round-robin ignores load")
}

// chiSquare returns the chi-square statistic of counts against expected shares.
func chiSquare(counts []int, shares []float64, total int) float64 {
	chi := 0.0
	for i, c := range counts {
		exp := shares[i] * float64(total)
		d := float64(c) - exp
		chi += d * d / exp
	}
	return chi
}

func uniformShares(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = 1 / float64(n)
	}
	return s
}

func TestRandomIsUniform(t *testing.T) {
	const n, draws = 16, 160000
	counts := make([]int, n)
	st := newTestState(n)
	for k := 0; k < draws; k++ {
		counts[Random{}.Pick(ids(n), st)]++
	}
	// 15 degrees of freedom: chi-square exceeds 56.49 with probability
	// 1e-6 (the 99.9th percentile, 37.70, failed make test once in a few
	// hundred runs: 39.24), while a worker never drawn adds 10000.
	assert.Less(t, chiSquare(counts, uniformShares(n), draws), 56.49, "counts %v", counts)
}

// TestP2CMatchesTwoDistinctSamples checks the whole pick distribution. With
// distinct loads ranked r = 0 (lowest) .. n-1, a pick from exactly two distinct
// uniform samples lands on rank r with probability 2(n-1-r)/(n(n-1)): the
// busiest never wins, and a third read would shift mass toward rank 0.
func TestP2CMatchesTwoDistinctSamples(t *testing.T) {
	const n, draws = 8, 112000
	st := newTestState(n)
	for i := range st.occ {
		st.occ[i].Store(int64(10 + i))
	}
	counts := make([]int, n)
	for k := 0; k < draws; k++ {
		counts[P2C{}.Pick(ids(n), st)]++
	}
	require.Zero(t, counts[n-1], "the busiest worker never wins")
	shares := make([]float64, n-1)
	for r := range shares {
		shares[r] = 2 * float64(n-1-r) / float64(n*(n-1))
	}
	// 6 degrees of freedom: chi-square exceeds 38.26 with probability 1e-6
	// (TestRandomIsUniform says why not the 99.9th percentile, 22.46).
	assert.Less(t, chiSquare(counts[:n-1], shares, draws), 38.26, "counts %v", counts)
}

func TestP2CSamplesAreDistinct(t *testing.T) {
	// With two candidates, distinct samples mean the less loaded always wins.
	st := newTestState(2)
	st.setLoads(5, 1)
	for k := 0; k < 1000; k++ {
		require.Equal(t, 1, P2C{}.Pick(ids(2), st))
	}
}

func TestLeastLoadedPicksMinimumAndRotatesTies(t *testing.T) {
	ll := &LeastLoaded{}
	st := newTestState(6)
	st.setLoads(3, 1, 4, 1, 5, 1)
	counts := map[int]int{}
	for k := 0; k < 600; k++ {
		counts[ll.Pick(ids(6), st)]++
	}
	assert.Equal(t, map[int]int{1: 200, 3: 200, 5: 200}, counts, "ties at load 1 share evenly")

	st.setLoads(3, 2, 4, 0, 5, 1)
	for k := 0; k < 12; k++ {
		require.Equal(t, 3, ll.Pick(ids(6), st))
	}
}

func TestWeightedFollowsWeightOverLoad(t *testing.T) {
	st := newTestState(3)
	copy(st.weight, []float64{3, 1, 0})
	st.recum()
	counts := make([]int, 3)
	const draws = 40000
	for k := 0; k < draws; k++ {
		counts[Weighted{}.Pick(ids(3), st)]++
	}
	assert.Zero(t, counts[2], "zero weight is never picked")
	assert.InDelta(t, 0.75, float64(counts[0])/draws, 0.015)

	// Load divides the weight: 3/(1+3) < 1/(1+0), so the heavy worker loses
	// every comparison it is drawn into and keeps only its double draws (9/16).
	st.occ[0].Store(3)
	counts = make([]int, 3)
	for k := 0; k < draws; k++ {
		counts[Weighted{}.Pick(ids(3), st)]++
	}
	assert.InDelta(t, 0.5625, float64(counts[0])/draws, 0.015, "counts %v", counts)
}

func TestWeightedWithoutWeightsFallsBackToP2C(t *testing.T) {
	st := newTestState(2)
	st.weight = []float64{0, 0}
	st.recum()
	st.setLoads(9, 0)
	for k := 0; k < 100; k++ {
		require.Equal(t, 1, Weighted{}.Pick(ids(2), st))
	}
}

// TestWeightTableIsExact sums, for every candidate, the probability mass the
// alias slots give it and compares it with its share of the total weight.
func TestWeightTableIsExact(t *testing.T) {
	var tbl WeightTable
	for trial := 0; trial < 300; trial++ {
		n := 1 + rand.IntN(70)
		want := make([]float64, n)
		tbl.Reset()
		for i := range want {
			if rand.IntN(4) > 0 { // a quarter of the weights are zero
				want[i] = rand.Float64() * 10
			}
			tbl.Append(want[i])
		}
		tbl.Build()
		if !(tbl.Total() > 0) {
			continue
		}
		got := make([]float64, n)
		for i := 0; i < n; i++ {
			keep := float64(tbl.keep[i]) / (1 << 32)
			got[i] += keep / float64(n)
			got[tbl.alias[i]] += (1 - keep) / float64(n)
		}
		for i := range want {
			require.InDelta(t, want[i]/tbl.Total(), got[i], 1e-9, "trial %d n=%d candidate %d", trial, n, i)
			if want[i] == 0 {
				for r := uint64(0); r < 1<<8; r++ {
					require.NotEqual(t, i, tbl.Draw(r<<56|r), "a zero weight is drawn")
				}
			}
		}
	}
}

func TestWeightTableRebuildDoesNotAllocate(t *testing.T) {
	var tbl WeightTable
	fill := func() {
		tbl.Reset()
		for i := 0; i < 64; i++ {
			tbl.Append(float64(i % 7))
		}
		tbl.Build()
	}
	fill()
	assert.Zero(t, testing.AllocsPerRun(100, fill))
}

func TestParseModeAndNew(t *testing.T) {
	for _, m := range Modes {
		got, err := ParseMode(string(m))
		require.NoError(t, err)
		p, err := New(got)
		require.NoError(t, err)
		assert.Equal(t, m == ModeDirect, p == nil, string(m))
	}
	_, err := ParseMode("fastest")
	assert.ErrorContains(t, err, `unknown mode "fastest"`)
}

func TestPicksAllocateNothing(t *testing.T) {
	for name, p := range allPickers() {
		st := newTestState(64)
		st.occ[5].Store(3)
		c := ids(64)
		allocs := testing.AllocsPerRun(1000, func() { p.Pick(c, st) })
		assert.Zero(t, allocs, "%s allocates", name)
	}
}

func TestPickersConcurrentOccupancyReturnsToZero(t *testing.T) {
	for name, p := range allPickers() {
		st := newTestState(16)
		c := ids(16)
		var wg sync.WaitGroup
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 500; k++ {
					i := p.Pick(c, st)
					st.occ[i].Add(1)
					st.occ[i].Add(-1)
				}
			}()
		}
		wg.Wait()
		for i, o := range st.occ {
			require.Zero(t, o.Load(), "%s worker %d", name, i)
		}
	}
}

func BenchmarkPick(b *testing.B) {
	for _, name := range Modes {
		p := allPickers()[name]
		if p == nil {
			continue
		}
		for _, n := range []int{4, 64, 1024} {
			st := newTestState(n)
			for i := range st.occ {
				// Loads of at least 1 make least-loaded scan every worker
				// and weighted take its second draw.
				st.occ[i].Store(int64(1 + (i*7)%5))
			}
			c := ids(n)
			b.Run(fmt.Sprintf("%s/n=%d", name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					p.Pick(c, st)
				}
			})
			b.Run(fmt.Sprintf("%s/n=%d/parallel", name, n), func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						p.Pick(c, st)
					}
				})
			})
		}
	}
}
