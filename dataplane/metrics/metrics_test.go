package metrics

import (
	"bytes"
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
