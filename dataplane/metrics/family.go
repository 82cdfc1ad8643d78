package metrics

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Overflow is the label value a Family files the observations of values
// past its limit under.
const Overflow = "_other"

// Family is a histogram for each value of one label (a model's name, say),
// made when the value is first observed, up to limit values: the values
// past them share the histogram of Overflow, so a label the clients name
// cannot grow the scrape without bound. Finding a value's histogram reads
// an atomic snapshot of the list and compares without allocating; only a
// value's first observation takes the lock and allocates (its histogram
// and the longer list).
type Family struct {
	bounds []float64
	limit  int
	list   atomic.Pointer[[]member] // in the order the values came; Overflow's last
	mu     sync.Mutex               // guards adding to list
}

type member struct {
	value string
	h     *Histogram
}

// NewFamily returns a family of histograms over bounds (as NewHistogram),
// for up to limit values of its label.
func NewFamily(bounds []float64, limit int) *Family {
	return &Family{bounds: bounds, limit: limit}
}

// Of returns the histogram of the label's value.
func (f *Family) Of(value []byte) *Histogram {
	if h := f.find(value); h != nil {
		return h
	}
	return f.add(value)
}

// find returns value's histogram (Overflow's once the list is full), or
// nil.
func (f *Family) find(value []byte) *Histogram {
	p := f.list.Load()
	if p == nil {
		return nil
	}
	for _, m := range *p {
		if m.value == string(value) {
			return m.h
		}
	}
	if len(*p) > f.limit { // full: Overflow's is the last
		return (*p)[len(*p)-1].h
	}
	return nil
}

// add makes value's histogram, or Overflow's when the list is full.
func (f *Family) add(value []byte) *Histogram {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.find(value); h != nil { // another came first
		return h
	}
	var list []member
	if p := f.list.Load(); p != nil {
		list = *p
	}
	name := string(value)
	if len(list) == f.limit {
		name = Overflow
	}
	h := NewHistogram(f.bounds)
	list = append(slices.Clip(list), member{name, h})
	f.list.Store(&list)
	return h
}

// Family writes the histogram of each of f's values under name, labelled
// label="value", in the order the values came.
func (w *Writer) Family(name, label string, f *Family) {
	p := f.list.Load()
	if p == nil {
		return
	}
	for _, m := range *p {
		w.Histogram(name, m.h, label, m.value)
	}
}
