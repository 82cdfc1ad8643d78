// Package metrics keeps fastroute's counters and histograms in atomics and
// writes them in the Prometheus text format. Recording never locks or
// allocates; a scrape reads the atomics and never blocks the request path.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
)

// Counter is a monotonically increasing count. It is striped
// (xsync.Counter), so increments from many cores — every request counts
// itself — do not contend on one cache line; reading it sums the stripes.
// Make one with NewCounter.
type Counter struct{ c *xsync.Counter }

// NewCounter returns a counter at zero.
func NewCounter() Counter { return Counter{xsync.NewCounter()} }

// Inc adds one.
func (c Counter) Inc() { c.c.Inc() }

// Add adds d.
func (c Counter) Add(d uint64) { c.c.Add(int64(d)) }

// Value returns the current count.
func (c Counter) Value() uint64 { return uint64(c.c.Value()) }

// DefaultBuckets are latency bucket bounds in seconds, 10µs to 60s.
var DefaultBuckets = []float64{
	0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
	0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// Histogram counts observations into fixed buckets.
type Histogram struct {
	bounds []float64
	counts []atomic.Uint64 // one per bound, plus +Inf
	sumNs  atomic.Uint64
}

// NewHistogram returns a histogram over the given ascending bounds (seconds).
func NewHistogram(bounds []float64) *Histogram {
	return &Histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

// Observe records one duration.
func (h *Histogram) Observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(h.bounds) && s > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	if d > 0 {
		h.sumNs.Add(uint64(d))
	}
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}

// Writer writes Prometheus text exposition lines.
type Writer struct {
	w   *bufio.Writer
	err error
}

// Header writes the HELP and TYPE lines of a metric family.
func (w *Writer) Header(name, typ, help string) {
	w.printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// Single writes a family of one sample without labels: its header, then
// the value.
func (w *Writer) Single(name, typ, help string, value float64) {
	w.Header(name, typ, help)
	w.Sample(name, value)
}

// Sample writes one sample; labels alternate name, value.
func (w *Writer) Sample(name string, value float64, labels ...string) {
	if w.err != nil {
		return
	}
	_, w.err = w.w.WriteString(name)
	if len(labels) > 0 {
		w.w.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				w.w.WriteByte(',')
			}
			w.w.WriteString(labels[i])
			w.w.WriteString(`="`)
			w.w.WriteString(escapeLabel(labels[i+1]))
			w.w.WriteByte('"')
		}
		w.w.WriteByte('}')
	}
	w.w.WriteByte(' ')
	w.w.WriteString(formatFloat(value))
	_, w.err = w.w.WriteString("\n")
}

// Histogram writes the _bucket, _sum and _count samples of h, with the
// given labels (alternating name, value) before each bucket's le.
func (w *Writer) Histogram(name string, h *Histogram, labels ...string) {
	le := append(slices.Clip(labels), "le", "")
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i].Load()
		le[len(le)-1] = formatFloat(b)
		w.Sample(name+"_bucket", float64(cum), le...)
	}
	cum += h.counts[len(h.bounds)].Load()
	le[len(le)-1] = "+Inf"
	w.Sample(name+"_bucket", float64(cum), le...)
	w.Sample(name+"_sum", float64(h.sumNs.Load())/1e9, labels...)
	w.Sample(name+"_count", float64(cum), labels...)
}

func (w *Writer) printf(format string, args ...any) {
	if w.err == nil {
		_, w.err = fmt.Fprintf(w.w, format, args...)
	}
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

func escapeLabel(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\\' || c == '"' || c == '\n' {
			return strconv.Quote(s)[1 : len(strconv.Quote(s))-1]
		}
	}
	return s
}

// Collector writes one or more metric families at scrape time.
type Collector func(w *Writer)

// Set is the list of collectors a /metrics scrape writes, in order.
type Set struct {
	mu         sync.Mutex // guards collectors; taken by Register and scrapes only
	collectors []Collector
}

// Register appends a collector.
func (s *Set) Register(c Collector) {
	s.mu.Lock()
	s.collectors = append(s.collectors, c)
	s.mu.Unlock()
}

// WriteTo writes every collector's families to out.
func (s *Set) WriteTo(out io.Writer) (int64, error) {
	s.mu.Lock()
	cs := append([]Collector(nil), s.collectors...)
	s.mu.Unlock()
	cw := &countingWriter{w: out}
	w := &Writer{w: bufio.NewWriter(cw)}
	for _, c := range cs {
		c(w)
	}
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return cw.n, w.err
}

// Text is what c writes, as a scrape has it.
func Text(c Collector) string {
	var s Set
	s.Register(c)
	var b strings.Builder
	_, _ = s.WriteTo(&b) // a strings.Builder takes every write
	return b.String()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
