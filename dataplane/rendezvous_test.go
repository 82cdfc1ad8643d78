package dataplane

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func rendezvousAll(t *testing.T, reg *Registry, keys int) map[uint64]uint64 {
	t.Helper()
	out := map[uint64]uint64{}
	snap := reg.Snapshot()
	for k := uint64(0); k < uint64(keys); k++ {
		id, ok := snap.Rendezvous(mix64(k), PhaseAny, nil)
		require.True(t, ok)
		out[k] = id
	}
	return out
}

func TestRendezvousAgreesSpreadsByCapacityAndMovesOnlyTheLeaversKeys(t *testing.T) {
	a, b := newFleet(t, 4), newFleet(t, 4)
	onA, onB := rendezvousAll(t, a, 4000), rendezvousAll(t, b, 4000)
	assert.Equal(t, onA, onB, "two routers with the same workers agree")

	share := map[uint64]int{}
	for _, id := range onA {
		share[id]++
	}
	for id := uint64(1); id <= 4; id++ {
		assert.InDelta(t, 1000, share[id], 150, "worker %d", id)
	}

	require.NoError(t, a.Drain(3))
	after := rendezvousAll(t, a, 4000)
	for k, id := range onA {
		if id != 3 {
			assert.Equal(t, id, after[k], "key %d moved off a worker that stayed", k)
		} else {
			assert.NotEqual(t, uint64(3), after[k])
		}
	}

	weighted := NewRegistry()
	for id, c := range map[uint64]float64{1: 3, 2: 1} {
		sp := spec(id)
		sp.Capacity = c
		_, err := weighted.Add(sp)
		require.NoError(t, err)
	}
	share = map[uint64]int{}
	for _, id := range rendezvousAll(t, weighted, 4000) {
		share[id]++
	}
	assert.InDelta(t, 3000, share[1], 150, "capacity 3 of 4 takes three quarters")

	snap := a.Snapshot()
	assert.Zero(t, testing.AllocsPerRun(100, func() { snap.Rendezvous(42, PhaseAny, nil) }))
	_, ok := NewRegistry().Snapshot().Rendezvous(1, PhaseAny, nil)
	assert.False(t, ok)
}
