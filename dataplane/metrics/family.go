package metrics

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Overflow is the label value a Family files the observations of values
// past its limit under.
const Overflow = "_other"

// Family is a record T (a histogram, or a model's several metrics) for
// each value of one label (a model's name, say), made when the value is
// first seen, up to limit values: the values past them share the record
// of Overflow, so a label the clients name cannot grow the scrape without
// bound. Finding a value's record reads an atomic snapshot of the list and
// compares without allocating; only a value's first sighting takes the
// lock and allocates (its record and the longer list).
type Family[T any] struct {
	newRec func() *T
	limit  int
	list   atomic.Pointer[[]member[T]] // in the order the values came; Overflow's last
	mu     sync.Mutex                  // guards adding to list
}

type member[T any] struct {
	value string
	rec   *T
}

// NewFamily returns a family of the records newRec makes, for up to limit
// values of its label.
func NewFamily[T any](limit int, newRec func() *T) *Family[T] {
	return &Family[T]{newRec: newRec, limit: limit}
}

// Of returns the record of the label's value.
func (f *Family[T]) Of(value []byte) *T {
	if r := f.find(value); r != nil {
		return r
	}
	return f.add(value)
}

// find returns value's record (Overflow's once the list is full), or nil.
func (f *Family[T]) find(value []byte) *T {
	p := f.list.Load()
	if p == nil {
		return nil
	}
	for _, m := range *p {
		if m.value == string(value) {
			return m.rec
		}
	}
	if len(*p) > f.limit { // full: Overflow's is the last
		return (*p)[len(*p)-1].rec
	}
	return nil
}

// add makes value's record, or Overflow's when the list is full.
func (f *Family[T]) add(value []byte) *T {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.find(value); r != nil { // another came first
		return r
	}
	var list []member[T]
	if p := f.list.Load(); p != nil {
		list = *p
	}
	name := string(value)
	if len(list) == f.limit {
		name = Overflow
	}
	r := f.newRec()
	list = append(slices.Clip(list), member[T]{name, r})
	f.list.Store(&list)
	return r
}

// Each calls fn with each value and its record, in the order the values
// came (Overflow's last).
func (f *Family[T]) Each(fn func(value string, rec *T)) {
	p := f.list.Load()
	if p == nil {
		return
	}
	for _, m := range *p {
		fn(m.value, m.rec)
	}
}
