package mirrors

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestABadListIsRefusedNamingTheField(t *testing.T) {
	for _, c := range []struct {
		list []Mirror
		want string
	}{
		{[]Mirror{{To: "b", Percent: 1}}, "model_mirrors[0].model: empty"},
		{[]Mirror{{Model: "a", To: "b", Percent: 1}, {Model: "a", To: "c", Percent: 1}}, `model_mirrors[1].model: "a" is mirrored already`},
		{[]Mirror{{Model: "a", Percent: 1}}, "model_mirrors[0].to: empty"},
		{[]Mirror{{Model: "a", To: "a", Percent: 1}}, `model_mirrors[0].to: "a" is the model mirrored`},
		{[]Mirror{{Model: "a", To: "b"}}, "model_mirrors[0].percent: 0 is not above 0 and at most 100"},
		{[]Mirror{{Model: "a", To: "b", Percent: 100.5}}, "percent: 100.5 is not above 0"},
		{[]Mirror{{Model: "a", To: "b", Percent: math.NaN()}}, "percent: NaN is not above 0"},
		{[]Mirror{{Model: "a", To: "b", Percent: 5, MaxInflight: -1}}, "model_mirrors[0].max_inflight: -1 is negative"},
	} {
		_, err := New(c.list)
		require.Error(t, err, "%+v", c.list)
		assert.Contains(t, err.Error(), c.want)
	}
	tab, err := New(nil)
	require.NoError(t, err)
	assert.Nil(t, tab, "no mirrors: no table")
	assert.Nil(t, tab.Draw([]byte("a")), "the nil table copies nothing")
}

// A mirror copies its share of its model's requests and no other model's;
// at 100 percent every request.
func TestAMirrorCopiesItsShare(t *testing.T) {
	tab, err := New([]Mirror{
		{Model: "llama", To: "llama-next", Percent: 20, MaxInflight: 100000},
		{Model: "qwen", To: `qwen "fp8"`, Percent: 100},
	})
	require.NoError(t, err)
	copied := 0
	for range 10000 {
		if r := tab.Draw([]byte("llama")); r != nil {
			assert.Equal(t, "llama-next", r.To())
			assert.Equal(t, `"llama-next"`, string(r.Quoted()))
			copied++
		}
		assert.Nil(t, tab.Draw([]byte("llama-next")), "the shadow model is not mirrored")
	}
	assert.InDelta(t, 2000, copied, 200, "20 of 100 (the bound is 5 standard deviations)")
	for range 50 {
		r := tab.Draw([]byte("qwen"))
		require.NotNil(t, r, "100 percent: every request")
		assert.Equal(t, `"qwen \"fp8\""`, string(r.Quoted()))
		r.Done(OK)
	}
}

// Past MaxInflight copies in flight a request is not copied (counted
// skipped) until one ends; every copy's end is counted by its outcome,
// and a reload's table keeps the counts of the mirrors it keeps.
func TestCopiesInFlightAreBoundedAndCounted(t *testing.T) {
	tab, err := New([]Mirror{{Model: "a", To: "b", Percent: 100, MaxInflight: 2}, {Model: "c", To: "d", Percent: 100}})
	require.NoError(t, err)
	r1, r2 := tab.Draw([]byte("a")), tab.Draw([]byte("a"))
	require.NotNil(t, r1)
	require.NotNil(t, r2)
	assert.Nil(t, tab.Draw([]byte("a")), "two in flight: no third")
	r1.Done(OK)
	r3 := tab.Draw([]byte("a"))
	require.NotNil(t, r3, "one ended: room for another")
	r2.Done(Failed)
	r3.Done(Unserved)
	stats := func(tab *Table) []Stats {
		var out []Stats
		tab.Each(func(s Stats) { out = append(out, s) })
		return out
	}
	got := stats(tab)
	require.Len(t, got, 2)
	assert.Equal(t, Stats{Model: "a", To: "b", Percent: 100, Outcomes: [NumOutcomes]uint64{OK: 1, Failed: 1, Skipped: 1, Unserved: 1}}, got[0])
	assert.Equal(t, "c", got[1].Model)
	for range DefaultMaxInflight {
		require.NotNil(t, tab.Draw([]byte("c")))
	}
	assert.Nil(t, tab.Draw([]byte("c")), "max_inflight 0: DefaultMaxInflight")
	assert.Equal(t, int64(DefaultMaxInflight), stats(tab)[1].Inflight)

	next, err := New([]Mirror{{Model: "a", To: "b", Percent: 50}, {Model: "c", To: "e", Percent: 100}})
	require.NoError(t, err)
	next.KeepCounts(tab)
	got = stats(next)
	assert.Equal(t, [NumOutcomes]uint64{OK: 1, Failed: 1, Skipped: 1, Unserved: 1}, got[0].Outcomes, "the same mirror: counts kept")
	assert.Equal(t, [NumOutcomes]uint64{Skipped: 1}, stats(tab)[1].Outcomes)
	assert.Equal(t, [NumOutcomes]uint64{}, got[1].Outcomes, "another shadow model: counted anew")
	assert.Equal(t, "failed", Failed.String())
}

func TestADrawAllocatesNothing(t *testing.T) {
	tab, err := New([]Mirror{{Model: "a", To: "b", Percent: 50}})
	require.NoError(t, err)
	model := []byte("a")
	allocs := testing.AllocsPerRun(1000, func() {
		if r := tab.Draw(model); r != nil {
			r.Done(OK)
		}
	})
	assert.Zero(t, allocs)
}

func BenchmarkDraw(b *testing.B) {
	tab, err := New([]Mirror{{Model: "a", To: "b", Percent: 5}})
	require.NoError(b, err)
	model := []byte("a")
	b.ReportAllocs()
	for b.Loop() {
		if r := tab.Draw(model); r != nil {
			r.Done(OK)
		}
	}
}
