//go:build nonvml

package nvml

import "time"

// Collector is the nonvml stand-in: it builds without cgo and is never available.
type Collector struct{}

// NewSystem returns the stand-in collector.
func NewSystem() *Collector { return &Collector{} }

// Start always fails: this binary was built with the nonvml tag.
func (c *Collector) Start() error { return ErrUnavailable }

// Close does nothing.
func (c *Collector) Close() {}

// Latest is always nil.
func (c *Collector) Latest() *Snapshot { return nil }

// Refresh always fails.
func (c *Collector) Refresh(time.Time) error { return ErrUnavailable }
