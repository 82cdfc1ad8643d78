package aliases

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestABadListIsRefusedNamingTheField(t *testing.T) {
	for _, c := range []struct {
		list []Alias
		want string
	}{
		{[]Alias{{Name: "", Targets: []Target{{Model: "a"}}}}, "model_aliases[0].name: empty"},
		{[]Alias{{Name: "x", Targets: []Target{{Model: "a"}}}, {Name: "x", Targets: []Target{{Model: "b"}}}}, `model_aliases[1].name: "x" is an alias already`},
		{[]Alias{{Name: "x"}}, `model_aliases[0].targets: alias "x" has none`},
		{[]Alias{{Name: "x", Targets: make([]Target, MaxTargets+1)}}, "more than 16"},
		{[]Alias{{Name: "x", Targets: []Target{{Model: ""}}}}, "model_aliases[0].targets[0].model: empty"},
		{[]Alias{{Name: "x", Targets: []Target{{Model: "a", Weight: 1}, {Model: "a", Weight: 1}}}}, `targets[1].model: "a" is a target of alias "x" already`},
		{[]Alias{{Name: "x", Targets: []Target{{Model: "a", Weight: 1}, {Model: "b", Weight: -1}}}}, "targets[1].weight: -1 is negative"},
		{[]Alias{{Name: "x", Targets: []Target{{Model: "a"}, {Model: "b"}}}}, `every weight of alias "x" is 0`},
		{[]Alias{{Name: "x", Fallback: true, Targets: []Target{{Model: "a"}, {Model: "b", Weight: 2}}}}, "targets[1].weight: a fallback alias's targets take no weight"},
	} {
		_, err := New(c.list)
		require.Error(t, err, "%+v", c.list)
		assert.Contains(t, err.Error(), c.want)
	}
	tab, err := New(nil)
	require.NoError(t, err)
	assert.Nil(t, tab, "no aliases: no table")
	_, _, ok := tab.Resolve([]byte("x"), nil, nil)
	assert.False(t, ok, "the nil table resolves nothing")
}

// Requests for an alias split between its targets by weight: at random
// without a session, by the session's hash with one, so that all of a
// session's requests get one target; a target at 0 gets none, a single
// target all whatever its weight, and a name that is no alias resolves
// to nothing.
func TestAnAliasSplitsItsRequestsByWeight(t *testing.T) {
	tab, err := New([]Alias{
		{Name: "food-review", Targets: []Target{{Model: "food-review-v1", Weight: 90}, {Model: "food-review-v2", Weight: 10}, {Model: "food-review-v0", Weight: 0}}},
		{Name: "gpt-4o", Targets: []Target{{Model: `meta-llama/Llama-3.1-70B "instruct"`}}},
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"food-review", "gpt-4o"}, tab.Names())
	_, _, ok := tab.Resolve([]byte("food-review-v1"), nil, nil)
	assert.False(t, ok, "a target is no alias")

	count := map[string]int{}
	for range 10000 {
		to, quoted, ok := tab.Resolve([]byte("food-review"), nil, nil)
		require.True(t, ok)
		assert.Equal(t, strconv.Quote(string(to)), string(quoted))
		count[string(to)]++
	}
	assert.InDelta(t, 9000, count["food-review-v1"], 250, "90 of 100 (the bound is 5 standard deviations)")
	assert.InDelta(t, 1000, count["food-review-v2"], 250)
	assert.Zero(t, count["food-review-v0"], "weight 0: none")

	sessions := map[string]int{}
	for s := range 2000 {
		session := []byte(fmt.Sprintf("session-%d", s))
		first, _, _ := tab.Resolve([]byte("food-review"), session, nil)
		for range 3 {
			again, _, _ := tab.Resolve([]byte("food-review"), session, nil)
			require.Equal(t, string(first), string(again), "a session keeps its target")
		}
		sessions[string(first)]++
	}
	assert.InDelta(t, 1800, sessions["food-review-v1"], 120, "sessions split by weight too")

	to, quoted, ok := tab.Resolve([]byte("gpt-4o"), nil, nil)
	require.True(t, ok)
	assert.Equal(t, `meta-llama/Llama-3.1-70B "instruct"`, string(to), "one target: all of them, its weight unread")
	assert.Equal(t, `"meta-llama/Llama-3.1-70B \"instruct\""`, string(quoted), "quoted as JSON")

	got := map[string]uint64{}
	tab.Each(func(alias, model string, weight, requests uint64) { got[alias+" "+model] = requests })
	assert.Equal(t, uint64(count["food-review-v1"]+sessions["food-review-v1"]*4), got["food-review food-review-v1"])
	assert.Equal(t, uint64(1), got["gpt-4o meta-llama/Llama-3.1-70B \"instruct\""])
	assert.Zero(t, got["food-review food-review-v0"])

	assert.Zero(t, testing.AllocsPerRun(1000, func() { tab.Resolve([]byte("food-review"), []byte("s"), nil) }))
}

// A reload's table keeps the requests each alias's target got, for the
// targets it keeps; a new target starts at zero.
func TestANewTableKeepsTheCountsOfTheTargetsItKeeps(t *testing.T) {
	prev, err := New([]Alias{{Name: "a", Targets: []Target{{Model: "v1", Weight: 1}, {Model: "v2", Weight: 1}}}})
	require.NoError(t, err)
	for range 10 {
		prev.Resolve([]byte("a"), nil, nil)
	}
	next, err := New([]Alias{{Name: "a", Targets: []Target{{Model: "v2", Weight: 1}, {Model: "v3", Weight: 1}}}, {Name: "b", Targets: []Target{{Model: "v1"}}}})
	require.NoError(t, err)
	next.KeepCounts(prev)
	was, now := map[string]uint64{}, map[string]uint64{}
	prev.Each(func(alias, model string, _, requests uint64) { was[alias+"/"+model] = requests })
	next.Each(func(alias, model string, _, requests uint64) { now[alias+"/"+model] = requests })
	assert.Equal(t, uint64(10), was["a/v1"]+was["a/v2"])
	assert.Equal(t, was["a/v2"], now["a/v2"])
	assert.Zero(t, now["a/v3"])
	assert.Zero(t, now["b/v1"], "another alias's target of the same model is another count")
	next.KeepCounts(nil)
	var none *Table
	none.KeepCounts(prev)
}

// A fallback alias sends its requests to the first target, in order, that
// a routable worker serves; to its first when none does.
func TestAFallbackAliasTakesItsFirstTargetServed(t *testing.T) {
	tab, err := New([]Alias{{Name: "chat", Fallback: true, Targets: []Target{{Model: "big"}, {Model: "medium"}, {Model: "small"}}}})
	require.NoError(t, err)
	up := map[string]bool{"big": true, "medium": true, "small": true}
	serves := func(model []byte) bool { return up[string(model)] }
	to := func() string {
		m, _, ok := tab.Resolve([]byte("chat"), []byte("a session"), serves)
		require.True(t, ok)
		return string(m)
	}
	assert.Equal(t, "big", to())
	up["big"] = false
	assert.Equal(t, "medium", to())
	up["medium"] = false
	assert.Equal(t, "small", to())
	up["small"] = false
	assert.Equal(t, "big", to(), "none served: the first, whose error the request gets")
	up["medium"] = true
	assert.Equal(t, "medium", to())
	got := map[string][2]uint64{}
	tab.Each(func(_, model string, weight, requests uint64) { got[model] = [2]uint64{weight, requests} })
	assert.Equal(t, map[string][2]uint64{"big": {0, 2}, "medium": {0, 2}, "small": {0, 1}}, got, "no weights; the requests each took")
	assert.Zero(t, testing.AllocsPerRun(1000, func() { tab.Resolve([]byte("chat"), nil, serves) }))
}

// BenchmarkResolve draws a target of a weighted alias among three, by a
// session's hash and at random, and a fallback alias's first target
// served (in make bench).
func BenchmarkResolve(b *testing.B) {
	tab, err := New([]Alias{
		{Name: "food-review", Targets: []Target{{Model: "v1", Weight: 80}, {Model: "v2", Weight: 15}, {Model: "v3", Weight: 5}}},
		{Name: "chat", Fallback: true, Targets: []Target{{Model: "big"}, {Model: "small"}}},
	})
	require.NoError(b, err)
	model, chat, session := []byte("food-review"), []byte("chat"), []byte("session-1234")
	serves := func(m []byte) bool { return string(m) == "small" }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		switch i % 3 {
		case 0:
			tab.Resolve(model, session, serves)
		case 1:
			tab.Resolve(model, nil, serves)
		default:
			tab.Resolve(chat, nil, serves)
		}
	}
}
