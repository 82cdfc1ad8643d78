package pickers

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// costState adds engine costs to a testState; a negative cost means none.
type costState struct {
	*testState
	cost []float64
}

func (c *costState) Cost(i int) (float64, bool) { return c.cost[i], c.cost[i] >= 0 }

func TestCostPickersTakeTheCheapestAndSpreadTies(t *testing.T) {
	for name, p := range map[string]Picker{"weighted": Weighted{}, "load-aware": LoadAware{}} {
		st := &costState{testState: newTestState(4), cost: []float64{3, 1, 2, 5}}
		for k := 0; k < 50; k++ {
			assert.Equal(t, 1, p.Pick(ids(4), st), name)
		}
		st.cost = []float64{1, 1, 1, 2}
		seen := map[int]int{}
		for k := 0; k < 300; k++ {
			seen[p.Pick(ids(4), st)]++
		}
		assert.Len(t, seen, 3, "%s: ties spread over the cheapest", name)
		assert.Zero(t, seen[3], name)
		c := ids(4)
		assert.Zero(t, testing.AllocsPerRun(1000, func() { p.Pick(c, st) }), name)
	}
}

func TestLoadAwareWithoutEveryCostUsesOccupancyOverWeight(t *testing.T) {
	st := &costState{testState: newTestState(3), cost: []float64{0.1, -1, 0.1}}
	st.weight = []float64{1, 4, 1}
	st.recum()
	st.setLoads(1, 5, 2)
	// (1+1)/1 = 2, (5+1)/4 = 1.5, (2+1)/1 = 3: the heavy worker, though busiest.
	assert.Equal(t, 1, LoadAware{}.Pick(ids(3), st))
	st.setLoads(0, 7, 2)
	assert.Equal(t, 0, LoadAware{}.Pick(ids(3), st))
}
