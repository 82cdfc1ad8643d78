package pickers

import "slices"

// WeightTable holds candidate weights prepared for O(1) weighted draws with
// Walker's alias method (Vose's construction): slot i keeps itself with
// probability keep[i]/2^32 and otherwise yields alias[i], so one uniform
// 64-bit value gives one draw with two array reads and no search.
//
// The data plane appends the weights of a candidate set and calls Build once,
// off the request path for published snapshots. A table reused across builds
// keeps its storage, so rebuilding at the same size does not allocate.
type WeightTable struct {
	weight []float64
	keep   []uint64 // keep[i] in [0, 2^32]: slot i returns i when the low 32 bits are below it
	alias  []int32
	total  float64
	work   []int32 // Build's worklists
	scaled []float64
}

// Reset empties the table, keeping its storage.
func (t *WeightTable) Reset() {
	t.weight, t.keep, t.alias = t.weight[:0], t.keep[:0], t.alias[:0]
	t.total = 0
}

// Append adds the weight of the next candidate; negative and NaN weights count as 0.
func (t *WeightTable) Append(w float64) {
	if !(w > 0) {
		w = 0
	}
	t.weight = append(t.weight, w)
	t.total += w
}

// Len returns the number of weights appended.
func (t *WeightTable) Len() int { return len(t.weight) }

// Weight returns the weight of candidate i.
func (t *WeightTable) Weight(i int) float64 { return t.weight[i] }

// Total returns the sum of the weights.
func (t *WeightTable) Total() float64 { return t.total }

// Build prepares the alias slots for the weights appended since Reset.
func (t *WeightTable) Build() {
	n := len(t.weight)
	// slices.Grow reuses the storage when it is large enough.
	t.keep, t.alias = slices.Grow(t.keep[:0], n)[:n], slices.Grow(t.alias[:0], n)[:n]
	t.scaled = slices.Grow(t.scaled[:0], n)[:n]
	t.work = slices.Grow(t.work[:0], n)[:n]
	if !(t.total > 0) {
		return
	}
	// Scaled weights average 1. Small ones (< 1) fill the work list from the
	// front, large ones from the back; each small slot is topped up by a large one.
	small, large := 0, n
	positive := int32(-1)
	for i, w := range t.weight {
		t.scaled[i] = w * float64(n) / t.total
		if w > 0 {
			positive = int32(i)
		}
		if t.scaled[i] < 1 {
			t.work[small] = int32(i)
			small++
		} else {
			large--
			t.work[large] = int32(i)
		}
	}
	s, l := 0, large
	for s < small && l < n {
		sm, lg := t.work[s], t.work[l]
		s++
		t.keep[sm] = uint64(max(t.scaled[sm], 0) * (1 << 32))
		t.alias[sm] = lg
		t.scaled[lg] -= 1 - t.scaled[sm]
		if t.scaled[lg] < 1 {
			// lg became small: it takes sm's place in the small list.
			s--
			t.work[s] = lg
			l++
		}
	}
	// What is left has scaled weight 1 up to rounding: it keeps itself,
	// except a zero weight, which must never be drawn.
	for _, i := range t.work[s:small] {
		t.keep[i], t.alias[i] = 1<<32, i
		if t.weight[i] == 0 {
			t.keep[i], t.alias[i] = 0, positive
		}
	}
	for _, i := range t.work[l:n] {
		t.keep[i], t.alias[i] = 1<<32, i
	}
}

// Draw maps a uniform 64-bit value onto a candidate with probability
// proportional to its weight. The table must be built and its total positive.
func (t *WeightTable) Draw(r uint64) int {
	i := scale(uint32(r>>32), len(t.keep))
	if r&(1<<32-1) < t.keep[i] {
		return i
	}
	return int(t.alias[i])
}
