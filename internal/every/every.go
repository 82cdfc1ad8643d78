// Package every runs a function at an interval until a context ends: the
// loop of the periodic sweeps and lookups (Tick), and of the health probes
// and engine scrapes, whose interval a reload may change (Period).
package every

import (
	"context"
	"sync/atomic"
	"time"
)

// Tick calls f every d until ctx ends; the first call is d from now.
func Tick(ctx context.Context, d time.Duration, f func()) {
	NewPeriod(d).Tick(ctx, f)
}

// Period is an interval a reload may change (Set) while Loop runs on it.
type Period struct {
	d     atomic.Int64  // nanoseconds
	reset chan struct{} // Set gave a new one
}

// NewPeriod returns a Period of d.
func NewPeriod(d time.Duration) *Period {
	p := &Period{reset: make(chan struct{}, 1)}
	p.d.Store(int64(d))
	return p
}

// Get returns the period as it is now.
func (p *Period) Get() time.Duration { return time.Duration(p.d.Load()) }

// Set changes the period to d: Loop's next call comes d from now, not
// after the rest of the old period's wait (an hour's, going to a second).
// A d that is not positive is ignored (a ticker takes none).
func (p *Period) Set(d time.Duration) {
	if d <= 0 {
		return
	}
	p.d.Store(int64(d))
	select {
	case p.reset <- struct{}{}:
	default: // Loop has one to read already
	}
}

// Loop calls f at once, then every period (as Set leaves it) until ctx
// ends.
func (p *Period) Loop(ctx context.Context, f func()) {
	f()
	p.Tick(ctx, f)
}

// Tick calls f every period (as Set leaves it) until ctx ends; the first
// call is a period from now.
func (p *Period) Tick(ctx context.Context, f func()) {
	t := time.NewTicker(p.Get())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.reset:
			t.Reset(p.Get())
		case <-t.C:
			f()
		}
	}
}
