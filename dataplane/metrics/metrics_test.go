package metrics

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHistogramBucketsAndText(t *testing.T) {
	h := NewHistogram([]float64{0.001, 0.01})
	h.Observe(500 * time.Microsecond)
	h.Observe(5 * time.Millisecond)
	h.Observe(time.Second)
	var set Set
	set.Register(func(w *Writer) {
		w.Header("x_seconds", "histogram", "test")
		w.Histogram("x_seconds", h)
		w.Sample("y_total", 3, "route", `a"b`)
	})
	var buf bytes.Buffer
	_, err := set.WriteTo(&buf)
	require.NoError(t, err)
	out := buf.String()
	assert.Contains(t, out, "# TYPE x_seconds histogram\n")
	assert.Contains(t, out, `x_seconds_bucket{le="0.001"} 1`)
	assert.Contains(t, out, `x_seconds_bucket{le="0.01"} 2`)
	assert.Contains(t, out, `x_seconds_bucket{le="+Inf"} 3`)
	assert.Contains(t, out, "x_seconds_sum 1.0055\n")
	assert.Contains(t, out, "x_seconds_count 3\n")
	assert.Contains(t, out, `y_total{route="a\"b"} 3`)
}

func TestRecordingIsRaceFreeAndAllocationFree(t *testing.T) {
	h := NewHistogram(DefaultBuckets)
	c := NewCounter()
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 1000; k++ {
				h.Observe(time.Duration(k) * time.Microsecond)
				c.Inc()
			}
		}()
	}
	var set Set
	set.Register(func(w *Writer) { w.Histogram("h", h) })
	for k := 0; k < 10; k++ { // scrapes run beside the writers
		_, err := set.WriteTo(&bytes.Buffer{})
		require.NoError(t, err)
	}
	wg.Wait()
	assert.EqualValues(t, 64000, h.Count())
	assert.EqualValues(t, 64000, c.Value())
	assert.Zero(t, testing.AllocsPerRun(1000, func() { h.Observe(time.Millisecond); c.Inc() }))
}

// A labelled histogram puts its labels before le on every bucket, and on
// its sum and count.
func TestAHistogramCarriesItsLabels(t *testing.T) {
	h := NewHistogram([]float64{0.001})
	h.Observe(2 * time.Millisecond)
	labels := []string{"worker", "7"}
	var buf bytes.Buffer
	set := Set{}
	set.Register(func(w *Writer) { w.Histogram("x_seconds", h, labels...) })
	_, err := set.WriteTo(&buf)
	require.NoError(t, err)
	assert.Equal(t, `x_seconds_bucket{worker="7",le="0.001"} 0
x_seconds_bucket{worker="7",le="+Inf"} 1
x_seconds_sum{worker="7"} 0.002
x_seconds_count{worker="7"} 1
`, buf.String())
	assert.Equal(t, []string{"worker", "7"}, labels, "the caller's labels are left as they were")
}

// A family makes a histogram per label value as values come, finds them
// again without allocating, files values past its limit under Overflow,
// and stays exact while many goroutines observe new and known values.
func TestAFamilyHasAHistogramPerValueUpToItsLimit(t *testing.T) {
	f := NewFamily(3, func() *Histogram { return NewHistogram([]float64{0.01}) })
	f.Of([]byte("llama")).Observe(time.Millisecond)
	f.Of([]byte("qwen")).Observe(time.Second)
	f.Of([]byte("llama")).Observe(20 * time.Millisecond)
	assert.Same(t, f.Of([]byte("llama")), f.Of([]byte("llama")))
	assert.NotSame(t, f.Of([]byte("llama")), f.Of([]byte("qwen")))
	assert.EqualValues(t, 2, f.Of([]byte("llama")).Count())
	assert.Zero(t, testing.AllocsPerRun(1000, func() { f.Of([]byte("qwen")).Observe(time.Millisecond) }),
		"a known value's histogram is found without allocating")

	f.Of([]byte("")).Observe(time.Millisecond) // the third value: the limit
	over := f.Of([]byte("mistral"))
	assert.Same(t, over, f.Of([]byte("phi")), "past the limit every new value shares one histogram")
	assert.NotSame(t, over, f.Of([]byte("llama")), "values within the limit keep their own")
	over.Observe(time.Millisecond)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { f.Of([]byte("gemma")).Observe(time.Millisecond) }),
		"nor is Overflow's for a value past the limit")

	var buf bytes.Buffer
	set := Set{}
	set.Register(func(w *Writer) {
		f.Each(func(model string, h *Histogram) { w.Histogram("ttft_seconds", h, "model", model) })
	})
	_, err := set.WriteTo(&buf)
	require.NoError(t, err)
	out := buf.String()
	assert.Contains(t, out, `ttft_seconds_bucket{model="llama",le="0.01"} 1`)
	assert.Contains(t, out, `ttft_seconds_count{model="llama"} 2`)
	assert.Contains(t, out, `ttft_seconds_count{model="qwen"} 1002`)
	assert.Contains(t, out, `ttft_seconds_count{model=""} 1`)
	assert.Contains(t, out, `ttft_seconds_count{model="_other"} 1002`)
	assert.NotContains(t, out, "mistral")
	assert.Equal(t, 4, strings.Count(out, "_count{"), "three values and Overflow")

	g := NewFamily(8, func() *Histogram { return NewHistogram(DefaultBuckets) })
	var wg sync.WaitGroup
	for k := range 16 {
		wg.Go(func() {
			name := []byte{'m', byte('a' + k%10)}
			for range 1000 {
				g.Of(name).Observe(time.Millisecond)
			}
		})
	}
	wg.Wait()
	var total uint64
	for _, m := range *g.list.Load() {
		total += m.rec.Count()
	}
	assert.EqualValues(t, 16000, total, "no observation lost while values were added")
	assert.Len(t, *g.list.Load(), 9, "eight values and Overflow")
}
